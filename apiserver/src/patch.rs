//! Patch application: JSON merge patch (RFC 7386), JSON patch (RFC 6902), strategic merge patch
//! and the field-ownership bookkeeping used by server-side apply.
//!
//! Strategic merge patch follows `k8s.io/apimachinery/pkg/util/strategicpatch` for the list
//! strategies in [`super::resources::RESOURCES`]:
//! - maps merge recursively, `null` deletes a key;
//! - lists without a patch strategy are replaced by the patch list;
//! - `patchStrategy:"merge"` scalar lists are a set union (live order first, new items appended);
//! - `patchStrategy:"merge"` lists with a merge key merge element-wise by that key; elements
//!   carrying `"$patch": "delete"` remove the matching element; an element `{"$patch": "replace"}`
//!   makes the remaining patch elements replace the list wholesale (order kept);
//! - `"$patch": "replace"` / `"delete"` in a map replaces / removes that map;
//! - `$retainKeys`, `$deleteFromPrimitiveList/<field>` and `$setElementOrder/<field>` are
//!   supported.
//! - element order in merging lists follows upstream's `normalizeElementOrder`: patch elements
//!   keep the patch (or `$setElementOrder`) order, live-only elements keep the live order, and the
//!   two are interleaved as `mergeSortedSlice` does (so a new element lands before live-only
//!   elements, e.g. adding finalizer `b` to `[a]` gives `[b, a]`).
//!
//! Deliberate difference: when the live object lacks a list, upstream copies the patch list
//! verbatim (directive elements included, which then decode as empty elements); we build the list
//! from the patch with directives applied.
//!
//! Anything else (unknown `$` directives, directives inside lists without a merge strategy,
//! merge-key elements without the key) is rejected with 422 instead of guessing.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use super::error::ApiError;
use super::resources::{ListStrategy, ResourceInfo};

/// Apply a strategic merge patch to `live`.
pub fn strategic_merge(r: &ResourceInfo, live: &Value, patch: &Value) -> Result<Value, ApiError> {
    let Value::Object(p) = patch else {
        return Err(ApiError::bad_request(
            "strategic merge patch must be a JSON object",
        ));
    };
    let mut out = match live {
        Value::Object(m) => m.clone(),
        _ => Map::new(),
    };
    merge_map(r, &mut out, p, "")?;
    Ok(Value::Object(out))
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn merge_map(
    r: &ResourceInfo,
    orig: &mut Map<String, Value>,
    patch: &Map<String, Value>,
    path: &str,
) -> Result<(), ApiError> {
    match patch.get("$patch") {
        None => {}
        Some(Value::String(s)) if s == "replace" => {
            let mut fresh = Map::new();
            let mut stripped = patch.clone();
            stripped.remove("$patch");
            merge_map(r, &mut fresh, &stripped, path)?;
            *orig = fresh;
            return Ok(());
        }
        Some(Value::String(s)) if s == "delete" => {
            orig.clear();
            return Ok(());
        }
        Some(other) => {
            return Err(ApiError::unprocessable(format!(
                "strategic merge patch: unknown patch type {other} in a map at {}",
                display(path)
            )))
        }
    }
    // $retainKeys: every patched field must be listed; live fields not listed are cleared.
    if let Some(v) = patch.get("$retainKeys") {
        let keys: Vec<&str> = v
            .as_array()
            .and_then(|a| a.iter().map(Value::as_str).collect::<Option<Vec<_>>>())
            .ok_or_else(|| {
                ApiError::unprocessable(
                    "strategic merge patch: $retainKeys must be a list of strings",
                )
            })?;
        for (k, v) in patch {
            if v.is_null() || k.starts_with('$') {
                continue;
            }
            if !keys.contains(&k.as_str()) {
                return Err(ApiError::unprocessable(format!(
                    "strategic merge patch: field {k:?} at {} is not listed in $retainKeys",
                    display(path)
                )));
            }
        }
        orig.retain(|k, _| keys.contains(&k.as_str()));
    }
    // $setElementOrder/<field> is processed first, together with its list, as upstream does.
    let mut done: Vec<&str> = Vec::new();
    for (k, v) in patch {
        let Some(field) = k.strip_prefix("$setElementOrder/") else {
            continue;
        };
        let order = v.as_array().ok_or_else(|| {
            ApiError::unprocessable(format!("strategic merge patch: {k} must be a list"))
        })?;
        let sub = join(path, field);
        let key = match r.list_strategy(&sub) {
            ListStrategy::MergeByKey(key) => Some(key),
            ListStrategy::MergePrimitive => None,
            ListStrategy::Atomic => {
                return Err(ApiError::unprocessable(format!(
                    "strategic merge patch: $setElementOrder on {sub}, which has no merge strategy"
                )))
            }
        };
        let live = match orig.get(field) {
            Some(Value::Array(l)) => Some(l.clone()),
            _ => None,
        };
        let patch_list = match patch.get(field) {
            Some(Value::Array(l)) => Some(l),
            Some(_) => {
                return Err(ApiError::unprocessable(format!(
                    "strategic merge patch: {sub} must be a list"
                )))
            }
            None => None,
        };
        let merged = match (&live, patch_list) {
            (Some(l), None) => l.clone(),
            (None, Some(p)) => merge_list(r, Vec::new(), p, &sub)?,
            (Some(l), Some(p)) => merge_list(r, l.clone(), p, &sub)?,
            (None, None) => continue,
        };
        let ident = |x: &Value| -> Value {
            match key {
                Some(k) => x.get(k).cloned().unwrap_or(Value::Null),
                None => x.clone(),
            }
        };
        let order_ids: Vec<Value> = order.iter().map(ident).collect();
        let (in_patch, server_only): (Vec<Value>, Vec<Value>) = merged
            .into_iter()
            .partition(|x| order_ids.contains(&ident(x)));
        let server_ids: Vec<Value> = live.unwrap_or_default().iter().map(ident).collect();
        let result = normalize_order(in_patch, server_only, &order_ids, &server_ids, &ident);
        orig.insert(field.to_string(), Value::Array(result));
        done.push(field);
    }
    for (k, v) in patch {
        if k == "$patch"
            || k == "$retainKeys"
            || k.starts_with("$setElementOrder/")
            || done.contains(&k.as_str())
        {
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let sub = join(path, field);
            if r.list_strategy(&sub) != ListStrategy::MergePrimitive {
                return Err(ApiError::unprocessable(format!(
                    "strategic merge patch: $deleteFromPrimitiveList on {sub}, which is not a merging list of scalars"
                )));
            }
            let values = v.as_array().ok_or_else(|| {
                ApiError::unprocessable(format!("strategic merge patch: {k} must be a list"))
            })?;
            if let Some(Value::Array(l)) = orig.get_mut(field) {
                l.retain(|x| !values.contains(x));
            }
            continue;
        }
        if k.starts_with('$') {
            return Err(ApiError::unprocessable(format!(
                "strategic merge patch: unsupported directive {k:?} at {}",
                display(path)
            )));
        }
        let sub = join(path, k);
        match v {
            Value::Null => {
                orig.remove(k);
            }
            Value::Object(pm) => {
                if pm.get("$patch").and_then(Value::as_str) == Some("delete") {
                    orig.remove(k);
                    continue;
                }
                let slot = orig
                    .entry(k.clone())
                    .or_insert_with(|| Value::Object(Map::new()));
                if !slot.is_object() {
                    *slot = Value::Object(Map::new());
                }
                if let Value::Object(om) = slot {
                    merge_map(r, om, pm, &sub)?;
                }
            }
            Value::Array(pl) => {
                let live = match orig.remove(k) {
                    Some(Value::Array(l)) => l,
                    _ => Vec::new(),
                };
                let merged = merge_list(r, live, pl, &sub)?;
                orig.insert(k.clone(), Value::Array(merged));
            }
            scalar => {
                orig.insert(k.clone(), scalar.clone());
            }
        }
    }
    Ok(())
}

/// Upstream's `normalizeElementOrder`: patch items in patch order, server-only items in live
/// order, then interleaved by `mergeSortedSlice` (a server-only item goes first only if both it
/// and the next patch item are in the live list and it comes earlier there).
fn normalize_order(
    mut patch_items: Vec<Value>,
    mut server_only: Vec<Value>,
    patch_order: &[Value],
    server_order: &[Value],
    ident: &dyn Fn(&Value) -> Value,
) -> Vec<Value> {
    let pos = |order: &[Value], v: &Value| order.iter().position(|o| *o == ident(v));
    patch_items.sort_by_key(|v| pos(patch_order, v).unwrap_or(usize::MAX));
    server_only.sort_by_key(|v| pos(server_order, v).unwrap_or(usize::MAX));
    let mut out = Vec::with_capacity(patch_items.len() + server_only.len());
    let mut left = server_only.into_iter().peekable();
    let mut right = patch_items.into_iter().peekable();
    loop {
        match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(_), None) => out.extend(left.next()),
            (None, Some(_)) => out.extend(right.next()),
            (Some(l), Some(rv)) => {
                let take_left = match (pos(server_order, l), pos(server_order, rv)) {
                    (Some(li), Some(ri)) => li < ri,
                    _ => false,
                };
                if take_left {
                    out.extend(left.next());
                } else {
                    out.extend(right.next());
                }
            }
        }
    }
    out
}

fn display(path: &str) -> &str {
    if path.is_empty() {
        "the top level"
    } else {
        path
    }
}

fn has_directive(v: &Value) -> bool {
    v.as_object()
        .is_some_and(|m| m.keys().any(|k| k.starts_with('$')))
}

fn merge_list(
    r: &ResourceInfo,
    live: Vec<Value>,
    patch: &[Value],
    path: &str,
) -> Result<Vec<Value>, ApiError> {
    match r.list_strategy(path) {
        ListStrategy::Atomic => {
            if patch.iter().any(has_directive) {
                return Err(ApiError::unprocessable(format!(
                    "strategic merge patch: {path} has no merge strategy (it is replaced as a whole); patch directives inside it are not supported"
                )));
            }
            Ok(patch.to_vec())
        }
        ListStrategy::MergePrimitive => {
            if patch.iter().any(|v| v.is_object() || v.is_array()) {
                return Err(ApiError::unprocessable(format!(
                    "strategic merge patch: {path} is a merging list of scalars; objects or directives in it are not supported"
                )));
            }
            let mut merged: Vec<Value> = Vec::new();
            for v in live.iter().chain(patch.iter()) {
                if !merged.contains(v) {
                    merged.push(v.clone());
                }
            }
            let (in_patch, server_only): (Vec<Value>, Vec<Value>) =
                merged.into_iter().partition(|x| patch.contains(x));
            Ok(normalize_order(
                in_patch,
                server_only,
                patch,
                &live,
                &|v: &Value| v.clone(),
            ))
        }
        ListStrategy::MergeByKey(key) => {
            let mut original = live;
            let mut plain: Vec<&Map<String, Value>> = Vec::new();
            let mut replace = false;
            for v in patch {
                let Some(m) = v.as_object() else {
                    return Err(ApiError::unprocessable(format!(
                        "strategic merge patch: {path} must hold objects"
                    )));
                };
                match m.get("$patch") {
                    None => plain.push(m),
                    Some(Value::String(d)) if d == "delete" => {
                        let Some(id) = m.get(key) else {
                            return Err(ApiError::unprocessable(format!(
                                "strategic merge patch: a $patch: delete element of {path} does not contain declared merge key: {key}"
                            )));
                        };
                        original.retain(|l| l.get(key) != Some(id));
                    }
                    Some(Value::String(d)) if d == "replace" => replace = true,
                    Some(Value::String(d)) if d == "merge" => return Err(ApiError::unprocessable(
                        "strategic merge patch: merging lists cannot yet be specified in the patch",
                    )),
                    Some(other) => {
                        return Err(ApiError::unprocessable(format!(
                        "strategic merge patch: unknown patch type {other} in an element of {path}"
                    )))
                    }
                }
            }
            let build = |m: &Map<String, Value>| -> Result<Value, ApiError> {
                let mut fresh = Map::new();
                merge_map(r, &mut fresh, m, path)?;
                Ok(Value::Object(fresh))
            };
            if replace {
                // The remaining patch elements are the new list, in patch order.
                return plain.into_iter().map(build).collect();
            }
            let mut merged = original.clone();
            for m in &plain {
                let Some(id) = m.get(key) else {
                    return Err(ApiError::unprocessable(format!(
                        "strategic merge patch: an element of {path} does not contain declared merge key: {key}"
                    )));
                };
                match merged.iter().position(|l| l.get(key) == Some(id)) {
                    Some(i) => {
                        if let Value::Object(lm) = &mut merged[i] {
                            merge_map(r, lm, m, path)?;
                        } else {
                            merged[i] = build(m)?;
                        }
                    }
                    None => merged.push(build(m)?),
                }
            }
            let ident = |x: &Value| x.get(key).cloned().unwrap_or(Value::Null);
            let patch_ids: Vec<Value> = plain
                .iter()
                .map(|m| m.get(key).cloned().unwrap_or(Value::Null))
                .collect();
            let server_ids: Vec<Value> = original.iter().map(ident).collect();
            let (in_patch, server_only): (Vec<Value>, Vec<Value>) = merged
                .into_iter()
                .partition(|x| patch_ids.contains(&ident(x)));
            Ok(normalize_order(
                in_patch,
                server_only,
                &patch_ids,
                &server_ids,
                &ident,
            ))
        }
    }
}

/// Leaf field paths of an object (lists count as leaves), without `apiVersion`, `kind`,
/// `metadata.name`/`namespace`/`resourceVersion`/... identity fields.
pub fn leaf_paths(v: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    fn walk(v: &Value, path: &str, out: &mut BTreeSet<String>) {
        match v {
            Value::Object(m) if !m.is_empty() => {
                for (k, c) in m {
                    let sub = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}\u{1}{k}")
                    };
                    walk(c, &sub, out);
                }
            }
            _ => {
                if !path.is_empty() {
                    out.insert(path.to_string());
                }
            }
        }
    }
    walk(v, "", &mut out);
    out.retain(|p| {
        !IDENTITY.iter().any(|i| p == i) && !p.starts_with("metadata\u{1}managedFields")
    });
    out
}

const IDENTITY: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata\u{1}name",
    "metadata\u{1}namespace",
    "metadata\u{1}resourceVersion",
    "metadata\u{1}uid",
    "metadata\u{1}creationTimestamp",
    "metadata\u{1}generation",
    "metadata\u{1}deletionTimestamp",
    "metadata\u{1}deletionGracePeriodSeconds",
];

/// Value at a leaf path produced by [`leaf_paths`].
pub fn at_path<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('\u{1}').try_fold(v, |cur, k| cur.get(k))
}

/// Remove the field at a leaf path (and parents left empty).
pub fn remove_path(v: &mut Value, path: &str) {
    let parts: Vec<&str> = path.split('\u{1}').collect();
    fn rec(v: &mut Value, parts: &[&str]) {
        let Some(m) = v.as_object_mut() else { return };
        if parts.len() == 1 {
            m.remove(parts[0]);
            return;
        }
        if let Some(child) = m.get_mut(parts[0]) {
            rec(child, &parts[1..]);
            if child.as_object().is_some_and(Map::is_empty) {
                m.remove(parts[0]);
            }
        }
    }
    rec(v, &parts);
}

/// Field ownership of one object: manager -> owned leaf paths. Keys are `"<manager>|Apply"` or
/// `"<manager>|Update"`.
pub type Owners = BTreeMap<String, BTreeSet<String>>;

/// After a non-apply write by `manager`: fields that changed move to `manager|Update`, fields
/// that disappeared lose all owners.
pub fn record_update(owners: &mut Owners, manager: &str, old: Option<&Value>, new: &Value) {
    let new_paths = leaf_paths(new);
    let changed: BTreeSet<String> = new_paths
        .iter()
        .filter(|p| old.and_then(|o| at_path(o, p)) != at_path(new, p))
        .cloned()
        .collect();
    for set in owners.values_mut() {
        set.retain(|p| new_paths.contains(p) && !changed.contains(p));
    }
    if !changed.is_empty() {
        owners
            .entry(format!("{manager}|Update"))
            .or_default()
            .extend(changed);
    }
    owners.retain(|_, s| !s.is_empty());
}

/// Fields of `applied` owned by a different manager whose live value differs (apply conflicts).
pub fn apply_conflicts(
    owners: &Owners,
    manager: &str,
    live: &Value,
    applied: &Value,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in leaf_paths(applied) {
        if at_path(live, &p) == at_path(applied, &p) {
            continue;
        }
        for (key, set) in owners {
            let owner = key.rsplit_once('|').map(|(m, _)| m).unwrap_or(key);
            if owner != manager && set.contains(&p) {
                out.push((key.clone(), p.replace('\u{1}', ".")));
            }
        }
    }
    out
}
