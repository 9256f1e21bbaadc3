//! `--cloud-config` hot reload: the file is looked at every `--cloud-config-reload-period`
//! (default 5 s, 0 = off) and, when its bytes changed, handed to [`Provider::reload`] (the
//! provider's `reconfigure`, else a rebuilt instance swapped in; see `provider::lifecycle`).
//!
//! Kubernetes mounts a Secret or ConfigMap as `cloud.conf -> ..data/cloud.conf` with `..data ->
//! ..2024_05_01_10_00_00.123`, and kubelet updates it by writing a new timestamped directory
//! and renaming a new `..data` symlink over the old one. So the file is identified by what the
//! whole symlink chain resolves to: the resolved path and the target's device, inode, size and
//! modification time (a swap changes the resolved path and the inode; an in-place rewrite
//! changes the size or the time). Only then are the bytes read, and only bytes that differ from
//! those in force (or from the last bytes that failed) are reloaded: kubelet rewrites every key
//! of a Secret when one of them changes, and a `touch` changes nothing.
//!
//! Why polling and not inotify (the `notify` crate): kubelet refreshes a mounted Secret only
//! every sync period plus its cache TTL (a minute or more), so 5 s of polling adds little to
//! the delay; one look costs a `realpath` and a `stat` of a kubelet chain (about 10 µs,
//! measured), against six more crates, a watcher thread, and watches that must be re-added on
//! the directory after every symlink swap (an inotify watch on the file follows the old inode,
//! which kubelet deletes) and that do not fire on some network and FUSE file systems.
//!
//! The watch keeps a SHA-256 digest of the bytes in force (and of the last ones that failed),
//! not the bytes: a cloud config can be large (an inventory, a CA bundle) and the factory has
//! them already.
//!
//! A failed reload keeps the provider in force, logs one ERROR line and counts
//! `ccm_cloud_config_reloads_total{result="failure"}`; the same bytes are not tried again (fix
//! the file; a restart also retries). A file that cannot be read is one ERROR line (and one
//! `method="read"` failure) per distinct problem; the provider stays as it was.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;

use super::provider_health::HealthProbe;
use crate::provider::{Provider, ReloadMethod};

/// Default of `--cloud-config-reload-period`.
pub const DEFAULT_RELOAD_PERIOD: Duration = Duration::from_secs(5);

/// A modification this recent is re-read on every look even if the identity is unchanged (a
/// rewrite of the same size within one timestamp tick).
const RACY_WINDOW: Duration = Duration::from_secs(2);

/// The identity of the file the path resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    target: PathBuf,
    dev: u64,
    ino: u64,
    len: u64,
    modified: Option<SystemTime>,
}

impl Stamp {
    /// The identity of what `path` resolves to now.
    pub fn of(path: &Path) -> std::io::Result<Stamp> {
        let target = std::fs::canonicalize(path)?;
        let m = std::fs::metadata(&target)?;
        Ok(Stamp {
            target,
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            modified: m.modified().ok(),
        })
    }

    fn racy(&self) -> bool {
        self.modified
            .is_none_or(|t| t + RACY_WINDOW > SystemTime::now())
    }
}

/// What a look at the file found.
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    /// Nothing new to apply.
    None,
    /// New bytes (not the ones in force, not the last ones that failed).
    New(Vec<u8>),
    /// The file cannot be read (reported once per distinct problem).
    Unreadable(String),
}

/// A SHA-256 digest of a config's bytes.
type Digest = [u8; 32];

fn digest(bytes: &[u8]) -> Digest {
    let mut out = [0; 32];
    out.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref());
    out
}

/// The `--cloud-config` file and what was done with it.
#[derive(Debug)]
pub struct ConfigFile {
    path: PathBuf,
    stamp: Option<Stamp>,
    /// The bytes read at start, for the provider's factory ([`ConfigFile::bytes`]); dropped
    /// when the watch starts ([`spawn`]).
    initial: Vec<u8>,
    /// The digest of the bytes in force.
    applied: Digest,
    /// The digest of the last bytes whose reload failed.
    failed: Option<Digest>,
    /// The last read problem reported.
    problem: Option<String>,
}

impl ConfigFile {
    /// The file at `path`, whose `bytes` are in force; `stamp` is its identity taken before
    /// they were read (so a change in between is seen at the first look).
    pub fn new(path: &Path, stamp: Option<Stamp>, bytes: Vec<u8>) -> Self {
        Self {
            path: path.to_path_buf(),
            stamp,
            applied: digest(&bytes),
            initial: bytes,
            failed: None,
            problem: None,
        }
    }

    /// The bytes read at start (empty once the watch has started: it keeps their digest only).
    pub fn bytes(&self) -> &[u8] {
        &self.initial
    }

    /// The path given with `--cloud-config`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Look at the file.
    pub fn poll(&mut self) -> Change {
        let stamp = match Stamp::of(&self.path) {
            Ok(s) => s,
            Err(e) => return self.unreadable(e),
        };
        if self.stamp.as_ref() == Some(&stamp) && !stamp.racy() {
            return Change::None;
        }
        let bytes = match crate::args::read_input_file(&self.path) {
            Ok(b) => b,
            Err(e) => return self.unreadable(e),
        };
        self.problem = None;
        self.stamp = Some(stamp);
        let seen = digest(&bytes);
        if seen == self.applied || self.failed == Some(seen) {
            return Change::None;
        }
        Change::New(bytes)
    }

    fn unreadable(&mut self, e: std::io::Error) -> Change {
        let why = e.to_string();
        self.stamp = None;
        if self.problem.as_ref() == Some(&why) {
            return Change::None;
        }
        self.problem = Some(why.clone());
        Change::Unreadable(why)
    }

    /// `bytes` are in force now.
    pub fn applied(&mut self, bytes: &[u8]) {
        self.applied = digest(bytes);
        self.failed = None;
    }

    /// Reloading `bytes` failed (they are not tried again).
    pub fn failed(&mut self, bytes: &[u8]) {
        self.failed = Some(digest(bytes));
    }
}

/// Watch `file` every `period` until `stop`, reloading `provider` when it changes; a probe
/// (if any) is asked to look again after each reload.
pub fn spawn(
    mut file: ConfigFile,
    provider: Provider,
    period: Duration,
    probe: Option<HealthProbe>,
    stop: CancellationToken,
) {
    // The factory has had the bytes read at start; from here on only their digest is needed.
    file.initial = Vec::new();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(period) => {}
            }
            // A stat and maybe a read: off the runtime's workers (a network file system can
            // take its time).
            let looked = tokio::task::spawn_blocking(move || {
                let change = file.poll();
                (file, change)
            })
            .await;
            let change;
            (file, change) = match looked {
                Ok(v) => v,
                Err(e) => {
                    tracing::error!("--cloud-config watch stopped: {e}");
                    return;
                }
            };
            let path = file.path().display().to_string();
            match change {
                Change::None => {}
                Change::Unreadable(why) => {
                    provider.reload_metrics().count(ReloadMethod::Read, false);
                    tracing::error!(
                        config = %path,
                        "--cloud-config {path} cannot be read: {why}; keeping the cloud provider as it is"
                    );
                }
                Change::New(bytes) => match provider.reload(&bytes).await {
                    Ok(method) => {
                        let how = match method {
                            ReloadMethod::Reconfigure => "reconfigured in place",
                            _ => "rebuilt from its factory and swapped in",
                        };
                        tracing::info!(
                            config = %path,
                            method = method.as_str(),
                            "--cloud-config {path} changed: cloud provider {how}"
                        );
                        file.applied(&bytes);
                        if let Some(probe) = &probe {
                            probe.probe_now();
                        }
                    }
                    Err(e) => {
                        tracing::error!(
                            config = %path,
                            method = e.method.as_str(),
                            "--cloud-config {path} changed but cannot be applied, keeping the cloud provider as it was: {e}"
                        );
                        file.failed(&bytes);
                    }
                },
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A Secret volume as kubelet writes it: `name -> ..data/name`, `..data -> ..<version>`.
    fn kubelet_volume(dir: &Path, version: &str, text: &str) {
        let data = dir.join(format!("..{version}"));
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("cloud.conf"), text).unwrap();
        let tmp = dir.join("..data_tmp");
        symlink(format!("..{version}"), &tmp).unwrap();
        std::fs::rename(&tmp, dir.join("..data")).unwrap();
        if !dir.join("cloud.conf").exists() {
            symlink("..data/cloud.conf", dir.join("cloud.conf")).unwrap();
        }
    }

    fn watched(path: &Path) -> ConfigFile {
        let stamp = Stamp::of(path).ok();
        ConfigFile::new(path, stamp, std::fs::read(path).unwrap())
    }

    #[test]
    fn a_kubelet_symlink_swap_is_a_change_and_the_same_bytes_are_not() {
        let dir = tempfile::tempdir().unwrap();
        kubelet_volume(dir.path(), "v1", "region: a\n");
        let path = dir.path().join("cloud.conf");
        let mut file = watched(&path);
        assert_eq!(file.poll(), Change::None);

        kubelet_volume(dir.path(), "v2", "region: b\n");
        std::fs::remove_dir_all(dir.path().join("..v1")).unwrap();
        assert_eq!(file.poll(), Change::New(b"region: b\n".to_vec()));
        file.applied(b"region: b\n");
        assert_eq!(file.poll(), Change::None);

        // Another key of the Secret changed: a new directory, our bytes the same.
        kubelet_volume(dir.path(), "v3", "region: b\n");
        assert_eq!(file.poll(), Change::None);
    }

    #[test]
    fn a_same_size_rewrite_is_seen_and_failed_bytes_are_not_retried() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cloud.conf");
        std::fs::write(&path, "a: 1\n").unwrap();
        let mut file = watched(&path);
        // Same size, same second: the identity may not change, the racy window re-reads it.
        std::fs::write(&path, "a: 2\n").unwrap();
        assert_eq!(file.poll(), Change::New(b"a: 2\n".to_vec()));
        file.failed(b"a: 2\n");
        assert_eq!(file.poll(), Change::None, "reported once");
        std::fs::write(&path, "a: 3\n").unwrap();
        assert_eq!(file.poll(), Change::New(b"a: 3\n".to_vec()));
    }

    #[test]
    fn an_unreadable_file_is_reported_once_per_problem() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cloud.conf");
        std::fs::write(&path, "a: 1\n").unwrap();
        let mut file = watched(&path);
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(file.poll(), Change::Unreadable(why) if why.contains("No such file")));
        assert_eq!(file.poll(), Change::None);
        // Back with the bytes in force: nothing to do.
        std::fs::write(&path, "a: 1\n").unwrap();
        assert_eq!(file.poll(), Change::None);
        std::fs::remove_file(&path).unwrap();
        assert!(
            matches!(file.poll(), Change::Unreadable(_)),
            "a new problem"
        );
    }
}
