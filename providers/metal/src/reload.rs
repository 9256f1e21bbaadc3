//! The inventory file, re-read when it changes, without a restart or a thread of its own.
//!
//! Every call asks [`InventorySource::current`], which looks at the file's metadata (size,
//! modification time, inode) and re-reads it only when that changed, or while the modification
//! is too recent for the timestamp to tell two writes apart. A change is applied atomically: the
//! new text is parsed and validated whole before it replaces the inventory in force. A malformed
//! edit (or a vanished file) is logged once and the last good inventory stays in force; the next
//! good edit replaces it.

use std::hash::{DefaultHasher, Hasher};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use ccm_provider_abi::ProviderError;

use crate::inventory::Inventory;

/// How recent a modification must be for the file to be re-read on every call even though its
/// metadata has not changed (a rewrite of the same size within one timestamp tick).
const RACY_WINDOW: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
    ino: u64,
    dev: u64,
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Self {
        Self {
            len: m.len(),
            modified: m.modified().ok(),
            ino: m.ino(),
            dev: m.dev(),
        }
    }

    fn racy(&self) -> bool {
        match self.modified {
            Some(t) => t + RACY_WINDOW > SystemTime::now(),
            None => true,
        }
    }
}

struct State {
    current: Arc<Inventory>,
    stamp: Option<Stamp>,
    /// Hash of the text of `current`.
    good_hash: u64,
    /// Hash of the last text that failed, so one bad edit is parsed and reported once.
    bad_hash: Option<u64>,
    /// The last problem reported (bad text, unreadable file), `None` once a good text is in force.
    problem: Option<String>,
    reloads: u64,
}

/// The inventory in force and the file it comes from.
pub struct InventorySource {
    path: PathBuf,
    state: Mutex<State>,
}

fn hash(bytes: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    h.write(bytes);
    h.finish()
}

fn read(path: &Path) -> Result<(Vec<u8>, Stamp), String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot be read: {e}"))?;
    let bytes = std::fs::read(path).map_err(|e| format!("cannot be read: {e}"))?;
    Ok((bytes, Stamp::of(&meta)))
}

fn parse(bytes: &[u8]) -> Result<Inventory, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("is not UTF-8 text: {e}"))?;
    Inventory::parse(text)
}

impl InventorySource {
    /// Read the inventory at `path`; at start-up it must exist and be valid.
    pub fn open(path: &Path) -> Result<Self, ProviderError> {
        let (bytes, stamp) = read(path).map_err(|e| {
            ProviderError::invalid_config(format!("metal inventory {}: {e}", path.display()))
        })?;
        let inventory = parse(&bytes).map_err(|e| {
            ProviderError::invalid_config(format!("metal inventory {}: {e}", path.display()))
        })?;
        log::info!(
            "metal inventory {}: {} machines",
            path.display(),
            inventory.machines().len()
        );
        Ok(Self {
            path: path.to_path_buf(),
            state: Mutex::new(State {
                current: Arc::new(inventory),
                stamp: Some(stamp),
                good_hash: hash(&bytes),
                bad_hash: None,
                problem: None,
                reloads: 0,
            }),
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The inventory in force, after picking up a change of the file if there is one.
    pub fn current(&self) -> Arc<Inventory> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.refresh(&mut s);
        s.current.clone()
    }

    /// Why the file's current content is not in force (`None` when it is).
    pub fn problem(&self) -> Option<String> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.refresh(&mut s);
        s.problem.clone()
    }

    /// How many times a changed file replaced the inventory.
    pub fn reloads(&self) -> u64 {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).reloads
    }

    fn report(&self, s: &mut State, problem: String) {
        if s.problem.as_deref() != Some(problem.as_str()) {
            log::error!(
                "metal inventory {} {problem}; keeping the last good inventory ({} machines)",
                self.path.display(),
                s.current.machines().len()
            );
            s.problem = Some(problem);
        }
    }

    fn refresh(&self, s: &mut State) {
        let stamp = match std::fs::metadata(&self.path) {
            Ok(m) => Stamp::of(&m),
            Err(e) => {
                s.stamp = None;
                self.report(s, format!("cannot be read: {e}"));
                return;
            }
        };
        if s.stamp == Some(stamp) && !stamp.racy() {
            return;
        }
        let (bytes, stamp) = match read(&self.path) {
            Ok(r) => r,
            Err(e) => {
                s.stamp = None;
                self.report(s, e);
                return;
            }
        };
        s.stamp = Some(stamp);
        let h = hash(&bytes);
        if h == s.good_hash {
            // Touched, or back to the text in force after a bad edit.
            if s.problem.take().is_some() {
                log::info!(
                    "metal inventory {}: the text in force is back; {} machines",
                    self.path.display(),
                    s.current.machines().len()
                );
            }
            return;
        }
        if s.bad_hash == Some(h) {
            return;
        }
        match parse(&bytes) {
            Ok(inventory) => {
                log::info!(
                    "metal inventory {} changed: {} machines (was {})",
                    self.path.display(),
                    inventory.machines().len(),
                    s.current.machines().len()
                );
                s.current = Arc::new(inventory);
                s.good_hash = h;
                s.bad_hash = None;
                s.problem = None;
                s.reloads += 1;
            }
            Err(e) => {
                s.bad_hash = Some(h);
                self.report(s, format!("is invalid: {e}"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, text: &str) {
        // Write-then-rename, as editors and ConfigMap volume updates do.
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    #[test]
    fn start_up_needs_a_valid_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inv.yaml");
        let e = InventorySource::open(&path).err().unwrap();
        assert!(e.to_string().contains("cannot be read"), "{e}");
        std::fs::write(&path, "machines: [{name: a}]").unwrap();
        let e = InventorySource::open(&path).err().unwrap();
        assert!(e.to_string().contains("needs an `id`"), "{e}");
        assert!(e.to_string().contains("inv.yaml"), "{e}");
    }

    #[test]
    fn edits_are_picked_up_and_bad_edits_keep_the_last_good_inventory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inv.yaml");
        std::fs::write(&path, "machines: [{name: a, id: a}]").unwrap();
        let src = InventorySource::open(&path).unwrap();
        assert_eq!(src.current().machines().len(), 1);
        assert_eq!(src.problem(), None);

        write(&path, "machines: [{name: a, id: a}, {name: b, id: b}]");
        assert_eq!(src.current().machines().len(), 2);
        assert_eq!(src.reloads(), 1);

        // Duplicate provider IDs: refused as a whole, the two-machine inventory stays.
        write(&path, "machines: [{name: a, id: a}, {name: c, id: a}]");
        let inv = src.current();
        assert_eq!(inv.machines().len(), 2);
        assert!(inv.by_name("b").is_some() && inv.by_name("c").is_none());
        let p = src.problem().unwrap();
        assert!(p.contains("duplicate provider ID"), "{p}");
        assert_eq!(src.reloads(), 1);

        // Unparsable text: still the last good one.
        write(&path, "machines: [");
        assert_eq!(src.current().machines().len(), 2);
        assert!(src.problem().unwrap().contains("does not parse"));

        // A vanished file, then a good edit.
        std::fs::remove_file(&path).unwrap();
        assert_eq!(src.current().machines().len(), 2);
        assert!(src.problem().unwrap().contains("cannot be read"));
        write(&path, "machines: [{name: z, id: z}]");
        assert_eq!(src.current().machines()[0].name, "z");
        assert_eq!(src.problem(), None);
        assert_eq!(src.reloads(), 2);
    }

    #[test]
    fn same_size_rewrites_in_place_are_seen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inv.yaml");
        std::fs::write(&path, "machines: [{name: a, id: 1}]").unwrap();
        let src = InventorySource::open(&path).unwrap();
        // Same length, same inode, written straight away (same timestamp tick on coarse clocks).
        std::fs::write(&path, "machines: [{name: b, id: 2}]").unwrap();
        assert_eq!(src.current().machines()[0].name, "b");
        // Back to the first text: a change like any other.
        std::fs::write(&path, "machines: [{name: a, id: 1}]").unwrap();
        assert_eq!(src.current().machines()[0].name, "a");
    }

    #[test]
    fn reverting_a_bad_edit_clears_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inv.yaml");
        let good = "machines: [{name: a, id: a}]";
        std::fs::write(&path, good).unwrap();
        let src = InventorySource::open(&path).unwrap();
        write(&path, "machines: 7");
        assert!(src.problem().is_some());
        write(&path, good);
        assert_eq!(src.problem(), None);
        assert_eq!(src.reloads(), 0);
    }
}
