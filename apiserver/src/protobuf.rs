//! Request bodies in Kubernetes' protobuf encoding (`application/vnd.kubernetes.protobuf`),
//! decoded into the JSON the rest of the server works on.
//!
//! kubectl's typed commands (`kubectl create service loadbalancer|clusterip|nodeport|
//! externalname`, `create namespace`, `create configmap`, `create secret generic`) send their
//! object as protobuf and do not retry with JSON when a server refuses it; a real API server
//! accepts both. What is decoded here is what those commands send: the `k8s\0` envelope
//! (`runtime.Unknown`: type meta and the raw message) around a core/v1 `Service`, `Namespace`,
//! `ConfigMap` or `Secret`, with the fields of `k8s.io/api/core/v1/generated.proto` and
//! `apimachinery/pkg/apis/meta/v1/generated.proto` that a create or update of those kinds
//! carries. Any other kind is refused with 415 and a message naming the ones accepted (JSON
//! works for every kind). Differences from upstream's decoder: `metadata.managedFields`,
//! `creationTimestamp`, `deletionTimestamp` and `status` are ignored (the server sets them), and
//! empty strings and zero numbers are left out as JSON's `omitempty` would.
//! Responses are always JSON (kubectl accepts JSON too).

use serde_json::{Map, Value};

/// The envelope's first bytes.
const MAGIC: &[u8] = b"k8s\0";

/// The media type.
pub(crate) const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// The kinds whose protobuf is decoded.
pub(crate) const KINDS: &str = "v1 Service, Namespace, ConfigMap and Secret";

#[derive(Clone, Copy)]
enum Ty {
    Str,
    Int,
    Bool,
    Msg(&'static [Field]),
    /// `map<string, string>`.
    MapStr,
    /// `map<string, bytes>`.
    MapBytes,
    /// `intstr.IntOrString`.
    IntOrStr,
    /// Read and left out (set by the server).
    Ignored,
}

#[derive(Clone, Copy)]
struct Field {
    number: u32,
    name: &'static str,
    ty: Ty,
    repeated: bool,
}

const fn one(number: u32, name: &'static str, ty: Ty) -> Field {
    Field {
        number,
        name,
        ty,
        repeated: false,
    }
}

const fn many(number: u32, name: &'static str, ty: Ty) -> Field {
    Field {
        number,
        name,
        ty,
        repeated: true,
    }
}

const OWNER_REFERENCE: &[Field] = &[
    one(5, "apiVersion", Ty::Str),
    one(1, "kind", Ty::Str),
    one(3, "name", Ty::Str),
    one(4, "uid", Ty::Str),
    one(6, "controller", Ty::Bool),
    one(7, "blockOwnerDeletion", Ty::Bool),
];

const OBJECT_META: &[Field] = &[
    one(1, "name", Ty::Str),
    one(2, "generateName", Ty::Str),
    one(3, "namespace", Ty::Str),
    one(4, "selfLink", Ty::Str),
    one(5, "uid", Ty::Str),
    one(6, "resourceVersion", Ty::Str),
    one(7, "generation", Ty::Int),
    one(8, "creationTimestamp", Ty::Ignored),
    one(9, "deletionTimestamp", Ty::Ignored),
    one(10, "deletionGracePeriodSeconds", Ty::Int),
    one(11, "labels", Ty::MapStr),
    one(12, "annotations", Ty::MapStr),
    many(13, "ownerReferences", Ty::Msg(OWNER_REFERENCE)),
    many(14, "finalizers", Ty::Str),
    one(17, "managedFields", Ty::Ignored),
];

const SERVICE_PORT: &[Field] = &[
    one(1, "name", Ty::Str),
    one(2, "protocol", Ty::Str),
    one(6, "appProtocol", Ty::Str),
    one(3, "port", Ty::Int),
    one(4, "targetPort", Ty::IntOrStr),
    one(5, "nodePort", Ty::Int),
];

const CLIENT_IP_CONFIG: &[Field] = &[one(1, "timeoutSeconds", Ty::Int)];

const SESSION_AFFINITY_CONFIG: &[Field] = &[one(1, "clientIP", Ty::Msg(CLIENT_IP_CONFIG))];

const SERVICE_SPEC: &[Field] = &[
    many(1, "ports", Ty::Msg(SERVICE_PORT)),
    one(2, "selector", Ty::MapStr),
    one(3, "clusterIP", Ty::Str),
    many(18, "clusterIPs", Ty::Str),
    one(4, "type", Ty::Str),
    many(5, "externalIPs", Ty::Str),
    one(7, "sessionAffinity", Ty::Str),
    one(8, "loadBalancerIP", Ty::Str),
    many(9, "loadBalancerSourceRanges", Ty::Str),
    one(10, "externalName", Ty::Str),
    one(11, "externalTrafficPolicy", Ty::Str),
    one(12, "healthCheckNodePort", Ty::Int),
    one(13, "publishNotReadyAddresses", Ty::Bool),
    one(
        14,
        "sessionAffinityConfig",
        Ty::Msg(SESSION_AFFINITY_CONFIG),
    ),
    many(19, "ipFamilies", Ty::Str),
    one(17, "ipFamilyPolicy", Ty::Str),
    one(20, "allocateLoadBalancerNodePorts", Ty::Bool),
    one(21, "loadBalancerClass", Ty::Str),
    one(22, "internalTrafficPolicy", Ty::Str),
    one(23, "trafficDistribution", Ty::Str),
];

const SERVICE: &[Field] = &[
    one(1, "metadata", Ty::Msg(OBJECT_META)),
    one(2, "spec", Ty::Msg(SERVICE_SPEC)),
    one(3, "status", Ty::Ignored),
];

const NAMESPACE_SPEC: &[Field] = &[many(1, "finalizers", Ty::Str)];

const NAMESPACE: &[Field] = &[
    one(1, "metadata", Ty::Msg(OBJECT_META)),
    one(2, "spec", Ty::Msg(NAMESPACE_SPEC)),
    one(3, "status", Ty::Ignored),
];

const CONFIG_MAP: &[Field] = &[
    one(1, "metadata", Ty::Msg(OBJECT_META)),
    one(4, "immutable", Ty::Bool),
    one(2, "data", Ty::MapStr),
    one(3, "binaryData", Ty::MapBytes),
];

const SECRET: &[Field] = &[
    one(1, "metadata", Ty::Msg(OBJECT_META)),
    one(5, "immutable", Ty::Bool),
    one(2, "data", Ty::MapBytes),
    one(4, "stringData", Ty::MapStr),
    one(3, "type", Ty::Str),
];

/// `runtime.TypeMeta` of the envelope.
const TYPE_META: &[Field] = &[one(1, "apiVersion", Ty::Str), one(2, "kind", Ty::Str)];

/// Decode a protobuf request body into the object's JSON. `Err(None)`: not the envelope or a
/// kind not decoded here (the caller answers 415); `Err(Some(text))`: a broken body (400).
pub(crate) fn decode(body: &[u8]) -> Result<Value, Option<String>> {
    let Some(envelope) = body.strip_prefix(MAGIC) else {
        return Err(None);
    };
    let mut type_meta = Map::new();
    let mut raw: &[u8] = &[];
    let mut r = Reader::new(envelope);
    while let Some((number, wire)) = r.key().map_err(Some)? {
        match (number, wire) {
            (1, LEN) => type_meta = message(r.bytes().map_err(Some)?, TYPE_META).map_err(Some)?,
            (2, LEN) => raw = r.bytes().map_err(Some)?,
            _ => r.skip(wire).map_err(Some)?,
        }
    }
    let text = |k: &str| type_meta.get(k).and_then(Value::as_str).unwrap_or("");
    let schema = match (text("apiVersion"), text("kind")) {
        ("v1", "Service") => SERVICE,
        ("v1", "Namespace") => NAMESPACE,
        ("v1", "ConfigMap") => CONFIG_MAP,
        ("v1", "Secret") => SECRET,
        _ => return Err(None),
    };
    let mut object = message(raw, schema).map_err(Some)?;
    for key in ["apiVersion", "kind"] {
        object.insert(key.into(), type_meta[key].clone());
    }
    Ok(Value::Object(object))
}

const VARINT: u8 = 0;
const I64: u8 = 1;
const LEN: u8 = 2;
const I32: u8 = 5;

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut value = 0u64;
        for i in 0..10 {
            let (&b, rest) = self.buf.split_first().ok_or("protobuf: truncated varint")?;
            self.buf = rest;
            value |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("protobuf: varint longer than 10 bytes".into())
    }

    /// The next field's number and wire type; `None` at the end.
    fn key(&mut self) -> Result<Option<(u32, u8)>, String> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let number = u32::try_from(key >> 3).map_err(|_| "protobuf: field number too large")?;
        Ok(Some((number, (key & 7) as u8)))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.buf.len() {
            return Err("protobuf: truncated field".into());
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let n = self.varint()?;
        self.take(usize::try_from(n).map_err(|_| "protobuf: length too large")?)
    }

    fn skip(&mut self, wire: u8) -> Result<(), String> {
        match wire {
            VARINT => self.varint().map(drop),
            I64 => self.take(8).map(drop),
            LEN => self.bytes().map(drop),
            I32 => self.take(4).map(drop),
            other => Err(format!("protobuf: unsupported wire type {other}")),
        }
    }
}

fn utf8(bytes: &[u8]) -> Result<String, String> {
    String::from_utf8(bytes.to_vec()).map_err(|_| "protobuf: a string is not UTF-8".into())
}

fn base64(bytes: &[u8]) -> Value {
    serde_json::to_value(k8s_openapi::ByteString(bytes.to_vec())).unwrap_or(Value::Null)
}

/// A `map<string, V>` entry: key 1, value 2.
fn map_entry(bytes: &[u8], value_bytes: bool) -> Result<(String, Value), String> {
    let mut r = Reader::new(bytes);
    let (mut key, mut value) = (String::new(), None);
    while let Some((number, wire)) = r.key()? {
        match (number, wire) {
            (1, LEN) => key = utf8(r.bytes()?)?,
            (2, LEN) if value_bytes => value = Some(base64(r.bytes()?)),
            (2, LEN) => value = Some(Value::String(utf8(r.bytes()?)?)),
            _ => r.skip(wire)?,
        }
    }
    let empty = if value_bytes {
        base64(&[])
    } else {
        Value::String(String::new())
    };
    Ok((key, value.unwrap_or(empty)))
}

fn int_or_string(bytes: &[u8]) -> Result<Value, String> {
    let mut r = Reader::new(bytes);
    let (mut is_string, mut int, mut text) = (false, 0i64, String::new());
    while let Some((number, wire)) = r.key()? {
        match (number, wire) {
            (1, VARINT) => is_string = r.varint()? == 1,
            (2, VARINT) => int = r.varint()? as i64,
            (3, LEN) => text = utf8(r.bytes()?)?,
            _ => r.skip(wire)?,
        }
    }
    Ok(if is_string {
        Value::String(text)
    } else {
        Value::from(int as i32)
    })
}

fn message(bytes: &[u8], schema: &[Field]) -> Result<Map<String, Value>, String> {
    let mut out = Map::new();
    let mut r = Reader::new(bytes);
    while let Some((number, wire)) = r.key()? {
        let Some(field) = schema.iter().find(|f| f.number == number) else {
            r.skip(wire)?;
            continue;
        };
        let expected = match field.ty {
            Ty::Int | Ty::Bool => VARINT,
            Ty::Ignored => wire,
            _ => LEN,
        };
        if wire != expected {
            return Err(format!(
                "protobuf: field {} has wire type {wire}, expected {expected}",
                field.name
            ));
        }
        let value = match field.ty {
            Ty::Ignored => {
                r.skip(wire)?;
                continue;
            }
            // int32 and int64 alike: a negative int32 is sign-extended to 64 bits.
            Ty::Int => Value::from(r.varint()? as i64),
            Ty::Bool => Value::Bool(r.varint()? != 0),
            Ty::Str => Value::String(utf8(r.bytes()?)?),
            Ty::Msg(fields) => Value::Object(message(r.bytes()?, fields)?),
            Ty::IntOrStr => int_or_string(r.bytes()?)?,
            Ty::MapStr | Ty::MapBytes => {
                let (k, v) = map_entry(r.bytes()?, matches!(field.ty, Ty::MapBytes))?;
                out.entry(field.name)
                    .or_insert_with(|| Value::Object(Map::new()))
                    .as_object_mut()
                    .map(|m| m.insert(k, v));
                continue;
            }
        };
        if field.repeated {
            if let Some(list) = out
                .entry(field.name)
                .or_insert_with(|| Value::Array(Vec::new()))
                .as_array_mut()
            {
                list.push(value);
            }
            continue;
        }
        // Go's marshaller writes empty strings and zero numbers of non-pointer fields; JSON
        // leaves them out (`omitempty`).
        let empty = match &value {
            Value::String(s) => s.is_empty(),
            Value::Number(n) => n.as_i64() == Some(0),
            _ => false,
        };
        if !empty {
            out.insert(field.name.to_string(), value);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal protobuf writer for the tests: what Go's generated marshaller writes.
    #[derive(Default)]
    struct W(Vec<u8>);

    impl W {
        fn varint(&mut self, mut v: u64) {
            while v >= 0x80 {
                self.0.push((v as u8) | 0x80);
                v >>= 7;
            }
            self.0.push(v as u8);
        }
        fn key(&mut self, n: u32, wire: u8) -> &mut Self {
            self.varint(u64::from(n) << 3 | u64::from(wire));
            self
        }
        fn bytes(&mut self, n: u32, b: &[u8]) -> &mut Self {
            self.key(n, LEN);
            self.varint(b.len() as u64);
            self.0.extend_from_slice(b);
            self
        }
        fn str(&mut self, n: u32, s: &str) -> &mut Self {
            self.bytes(n, s.as_bytes())
        }
        fn int(&mut self, n: u32, v: i64) -> &mut Self {
            self.key(n, VARINT);
            self.varint(v as u64);
            self
        }
        fn msg(&mut self, n: u32, f: impl FnOnce(&mut W)) -> &mut Self {
            let mut inner = W::default();
            f(&mut inner);
            self.bytes(n, &inner.0)
        }
        fn entry(&mut self, n: u32, k: &str, v: &[u8]) -> &mut Self {
            self.msg(n, |e| {
                e.str(1, k).bytes(2, v);
            })
        }
    }

    fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
        let mut w = W::default();
        w.msg(1, |t| {
            t.str(1, api_version).str(2, kind);
        })
        .bytes(2, raw)
        .str(3, "")
        .str(4, "");
        [MAGIC, &w.0].concat()
    }

    #[test]
    fn a_service_as_kubectl_create_service_loadbalancer_sends_it() {
        let mut raw = W::default();
        raw.msg(1, |m| {
            m.str(1, "x")
                .str(2, "")
                .str(3, "")
                .int(7, 0)
                .msg(8, |_| {})
                .entry(11, "app", b"x");
        })
        .msg(2, |s| {
            s.msg(1, |p| {
                p.str(1, "80-8080")
                    .str(2, "TCP")
                    .int(3, 80)
                    .msg(4, |t| {
                        t.int(1, 0).int(2, 8080).str(3, "");
                    })
                    .int(5, 0);
            })
            .entry(2, "app", b"x")
            .str(3, "")
            .str(4, "LoadBalancer")
            .int(12, 0)
            .key(13, VARINT)
            .varint(0);
        })
        .msg(3, |st| {
            st.msg(1, |_| {});
        });
        let object = decode(&envelope("v1", "Service", &raw.0)).unwrap();
        assert_eq!(
            object,
            serde_json::json!({
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "x", "labels": {"app": "x"}},
                "spec": {
                    "ports": [{"name": "80-8080", "protocol": "TCP", "port": 80, "targetPort": 8080}],
                    "selector": {"app": "x"},
                    "type": "LoadBalancer",
                    "publishNotReadyAddresses": false
                }
            })
        );
    }

    #[test]
    fn secrets_configmaps_and_named_target_ports() {
        let mut raw = W::default();
        raw.msg(1, |m| {
            m.str(1, "s").str(3, "shop");
        })
        .entry(2, "token", b"\x00\xffabc")
        .str(3, "Opaque");
        let object = decode(&envelope("v1", "Secret", &raw.0)).unwrap();
        assert_eq!(object["data"]["token"], "AP9hYmM=");
        assert_eq!(object["metadata"]["namespace"], "shop");
        assert_eq!(object["type"], "Opaque");

        let mut raw = W::default();
        raw.msg(1, |m| {
            m.str(1, "c");
        })
        .entry(2, "k", b"v")
        .entry(3, "b", b"\x01");
        let object = decode(&envelope("v1", "ConfigMap", &raw.0)).unwrap();
        assert_eq!(object["data"], serde_json::json!({"k": "v"}));
        assert_eq!(object["binaryData"], serde_json::json!({"b": "AQ=="}));

        let mut port = W::default();
        port.msg(4, |t| {
            t.int(1, 1).str(3, "http");
        });
        assert_eq!(
            message(&port.0, SERVICE_PORT).unwrap()["targetPort"],
            "http"
        );
    }

    #[test]
    fn other_kinds_and_broken_bodies_are_refused() {
        assert_eq!(decode(b"{\"kind\": \"Service\"}"), Err(None));
        assert_eq!(decode(&envelope("v1", "Pod", &[])), Err(None));
        assert_eq!(decode(&envelope("apps/v1", "Service", &[])), Err(None));
        let mut truncated = envelope("v1", "Service", &[0x0a, 0x05, b'x']);
        truncated.truncate(truncated.len() - 1);
        assert!(matches!(decode(&truncated), Err(Some(_))));
        let mut wrong_wire = W::default();
        wrong_wire.int(1, 3);
        assert_eq!(
            decode(&envelope("v1", "Service", &wrong_wire.0)),
            Err(Some(
                "protobuf: field metadata has wire type 0, expected 2".into()
            ))
        );
    }
}
