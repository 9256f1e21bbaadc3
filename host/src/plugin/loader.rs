//! Opening one plugin file: permission checks, dlopen, abi_stable's header / version / layout
//! checks, then the plugin's `register` entry function.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use abi_stable::library::{
    AbiHeaderRef, LibraryError, RootModule, ROOT_MODULE_LOADER_NAME_WITH_NUL,
};
use abi_stable::sabi_types::VersionNumber;
use ccm_provider_abi::abi::{PluginModule_Ref, ProviderFactoryBox};

use super::registrar::HostRegistrar;
use super::{LoadedPlugin, SelectError};

/// How plugins are loaded.
#[derive(Debug, Clone)]
pub struct LoaderOptions {
    /// Load plugin files (and directories) writable by group/others or owned by another user.
    pub allow_insecure: bool,
    /// Most verbose level the host prints (`ccm_provider_abi::abi::log_level`), told to plugins.
    pub max_log_level: u8,
}

impl Default for LoaderOptions {
    fn default() -> Self {
        Self {
            allow_insecure: false,
            max_log_level: ccm_provider_abi::abi::log_level::INFO,
        }
    }
}

pub(super) struct Loaded {
    pub info: LoadedPlugin,
    pub registrations: Vec<(String, ProviderFactoryBox)>,
}

/// The `*.so` files of `dir`, sorted by name, after checking the directory itself.
pub(super) fn plugin_files(
    dir: &Path,
    options: &LoaderOptions,
) -> Result<Vec<PathBuf>, SelectError> {
    let err = |reason: String| SelectError::Directory {
        path: dir.to_path_buf(),
        reason,
    };
    let meta = fs::metadata(dir).map_err(|e| err(e.to_string()))?;
    if !meta.is_dir() {
        return Err(err("not a directory".into()));
    }
    if !options.allow_insecure {
        if let Some(problem) = ownership_problem(&meta) {
            return Err(err(format!(
                "{problem}; fix the directory's permissions or pass --allow-insecure-plugins"
            )));
        }
    }
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(|e| err(e.to_string()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|ext| ext == "so"))
        .collect();
    files.sort();
    Ok(files)
}

fn ownership_problem(meta: &fs::Metadata) -> Option<String> {
    let mode = meta.permissions().mode();
    if mode & 0o022 != 0 {
        return Some(format!(
            "is writable by group or others (mode {:o})",
            mode & 0o7777
        ));
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != 0 && meta.uid() != me {
        return Some(format!(
            "is owned by uid {}, neither root nor the current user (uid {me})",
            meta.uid()
        ));
    }
    None
}

/// Load and register one plugin; `Err` is the one-line reason it was refused.
pub(super) fn load(path: &Path, options: &LoaderOptions) -> Result<Loaded, String> {
    let meta = fs::metadata(path).map_err(|e| format!("cannot read the file: {e}"))?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    if !options.allow_insecure {
        if let Some(problem) = ownership_problem(&meta) {
            return Err(format!(
                "refusing to load: the file {problem}; fix it (chmod go-w / chown) or pass --allow-insecure-plugins"
            ));
        }
    }
    check_elf(path)?;

    // RTLD_NOW: a missing shared-library dependency or symbol fails here, at start-up, with the
    // path, rather than at the first call. RTLD_LOCAL: plugins cannot see each other's symbols.
    // SAFETY: loading a library runs its initialisers; plugins are trusted code once they pass
    // the permission checks above (the same trust as any binary the host runs).
    let library = unsafe {
        libloading::os::unix::Library::open(
            Some(path),
            libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_LOCAL,
        )
    }
    .map_err(|e| format!("cannot be loaded as a shared library: {}", dl_reason(&e)))?;

    // SAFETY: the symbol, when present, is abi_stable's `AbiHeaderRef` static; its type is
    // verified by `upgrade` (abi_stable version + C ABI self-tests) before anything else is read.
    let header: AbiHeaderRef = unsafe {
        match library.get::<AbiHeaderRef>(ROOT_MODULE_LOADER_NAME_WITH_NUL.as_bytes()) {
            Ok(symbol) => *symbol,
            Err(_) => {
                return Err(
                    "is not a ccm-host provider plugin (it exports no plugin root module; \
                     build it with ccm_provider_abi::export_plugin!)"
                        .into(),
                )
            }
        }
    };
    // Plugins are never unloaded (abi_stable keeps 'static references into them).
    std::mem::forget(library);

    let lib_header = header.upgrade().map_err(|e| match e {
        LibraryError::InvalidAbiHeader(_) => {
            "was built with an incompatible abi_stable release; rebuild it against the \
             ccm-provider-abi version this host uses"
                .to_string()
        }
        other => format!(
            "abi_stable header check failed: {}",
            first_line(&other.to_string())
        ),
    })?;

    let plugin_abi = lib_header.version_strings();
    let plugin_abi_text = plugin_abi.version.to_string();
    check_version(&plugin_abi_text)?;

    let module: PluginModule_Ref =
        lib_header
            .init_root_module::<PluginModule_Ref>()
            .map_err(|e| match &e {
                LibraryError::AbiInstability(_)
                | LibraryError::IncompatibleVersionNumber { .. } => {
                    let full = e.to_string();
                    tracing::debug!(plugin = %path.display(), "full ABI report:\n{full}");
                    format!(
                        "its plugin interface does not match this host ({}); rebuild it against \
                     ccm-provider-abi >= {}",
                        useful_tail(&full),
                        min_compatible()
                    )
                }
                other => format!(
                    "its root module failed to initialise: {}",
                    first_line(&other.to_string())
                ),
            })?;

    let registrar = HostRegistrar::new(path, options.max_log_level);
    let result = (module.register())(registrar.to_abi());
    let registrations = registrar.take();
    if let Err(e) = result.into_result() {
        return Err(format!("its register function failed: {e}"));
    }
    Ok(Loaded {
        info: LoadedPlugin {
            path: path.to_path_buf(),
            plugin_name: module.plugin_name().to_string(),
            plugin_version: module.plugin_version().to_string(),
            abi_version: plugin_abi_text,
            providers: Vec::new(),
        },
        registrations,
    })
}

/// Validate the ELF header and program headers before `dlopen`: the dynamic loader maps
/// segments straight from the file, so a truncated library would crash the host with SIGBUS
/// instead of failing cleanly.
fn check_elf(path: &Path) -> Result<(), String> {
    let bytes = fs::read(path).map_err(|e| format!("cannot read the file: {e}"))?;
    check_elf_bytes(&bytes).map_err(|why| format!("is not a ccm-host provider plugin ({why})"))
}

fn check_elf_bytes(b: &[u8]) -> Result<(), String> {
    const HEADER: usize = 64;
    if b.len() < 4 || &b[..4] != b"\x7fELF" {
        return Err(if b.len() < 4 {
            "file too short to be a shared library".into()
        } else {
            "not an ELF shared library".into()
        });
    }
    if b.len() < HEADER {
        return Err("file too short to be a shared library".into());
    }
    if b[4] != 2 || b[5] != 1 {
        return Err("not a 64-bit little-endian ELF file".into());
    }
    let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    let u64_at = |o: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[o..o + 8]);
        u64::from_le_bytes(a)
    };
    let e_type = u16_at(16);
    if e_type != 3 {
        return Err(format!("not a shared library (ELF type {e_type})"));
    }
    let machine = u16_at(18);
    let expected = if cfg!(target_arch = "x86_64") {
        Some(62)
    } else if cfg!(target_arch = "aarch64") {
        Some(183)
    } else {
        None
    };
    if let Some(expected) = expected {
        if machine != expected {
            return Err(format!(
                "built for another CPU architecture (ELF machine {machine}, this host needs {expected})"
            ));
        }
    }
    let len = b.len() as u64;
    let (phoff, phentsize, phnum) = (u64_at(32), u64::from(u16_at(54)), u64::from(u16_at(56)));
    let table_end = phoff.checked_add(phentsize.saturating_mul(phnum));
    if phentsize < 56 || table_end.is_none_or(|end| end > len) {
        return Err(format!(
            "truncated or corrupt: program headers lie outside the {len}-byte file"
        ));
    }
    for i in 0..phnum {
        let ph =
            usize::try_from(phoff + i * phentsize).map_err(|_| "corrupt program header offset")?;
        let p_type = u32::from_le_bytes([b[ph], b[ph + 1], b[ph + 2], b[ph + 3]]);
        let (offset, filesz) = (u64_at(ph + 8), u64_at(ph + 32));
        if p_type == 1 && offset.checked_add(filesz).is_none_or(|end| end > len) {
            return Err(format!(
                "truncated: a loadable segment ends at byte {} but the file has {len} bytes",
                offset.saturating_add(filesz)
            ));
        }
    }
    Ok(())
}

fn dl_reason(e: &libloading::Error) -> String {
    let text = e.to_string();
    // dlerror repeats the path; keep what follows it.
    match text.rsplit_once(": ") {
        Some((_, tail)) if !tail.is_empty() => tail.to_string(),
        _ => text,
    }
}

/// The oldest ABI version this host accepts: same major, same or newer minor.
pub fn min_compatible() -> String {
    let host = VersionNumber::new(PluginModule_Ref::VERSION_STRINGS).expect("own version parses");
    format!("{}.{}", host.major, host.minor)
}

fn check_version(plugin: &str) -> Result<(), String> {
    let host = VersionNumber::new(PluginModule_Ref::VERSION_STRINGS).expect("own version parses");
    let parsed = parse_version(plugin)
        .ok_or_else(|| format!("records an unparsable ccm-provider-abi version {plugin:?}"))?;
    let (major, minor) = parsed;
    if major != host.major || minor < host.minor {
        return Err(format!(
            "was built against ccm-provider-abi {plugin}, this host needs {}.x with x >= {}: \
             rebuild it against ccm-provider-abi >= {}",
            host.major,
            host.minor,
            min_compatible()
        ));
    }
    Ok(())
}

fn parse_version(v: &str) -> Option<(u32, u32)> {
    let mut parts = v.split('.');
    let major = parts.next()?.trim().parse().ok()?;
    let minor = parts.next()?.trim().parse().ok()?;
    Some((major, minor))
}

fn first_line(s: &str) -> String {
    s.lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_string()
}

/// abi_stable's layout report is ~2,000 lines; the last meaningful lines name the mismatch
/// (e.g. "mismatched type Expected: RStr<'a> Found: u32").
fn useful_tail(report: &str) -> String {
    let lines: Vec<&str> = report
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.chars().all(|c| matches!(c, '-' | '=' | '.' | '}' | '{')))
        .collect();
    let start = lines.len().saturating_sub(3);
    let tail = lines[start..].join(" / ");
    if tail.len() > 300 {
        format!("...{}", &tail[tail.len() - 300..])
    } else {
        tail
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_policy_same_major_same_or_newer_minor() {
        assert!(check_version("1.0.0").is_ok());
        assert!(check_version("1.3.2").is_ok());
        let err = check_version("0.9.0").unwrap_err();
        assert!(
            err.contains("rebuild it against ccm-provider-abi >= 1.0"),
            "{err}"
        );
        assert!(check_version("2.0.0").is_err());
        assert!(check_version("garbage").unwrap_err().contains("unparsable"));
    }

    #[test]
    fn elf_checks_reject_garbage_before_dlopen() {
        assert_eq!(
            check_elf_bytes(b"hello world").unwrap_err(),
            "not an ELF shared library"
        );
        assert_eq!(
            check_elf_bytes(b"\x7fEL").unwrap_err(),
            "file too short to be a shared library"
        );
        let mut header = vec![0u8; 64];
        header[..4].copy_from_slice(b"\x7fELF");
        header[4] = 1;
        assert_eq!(
            check_elf_bytes(&header).unwrap_err(),
            "not a 64-bit little-endian ELF file"
        );
        header[4] = 2;
        header[5] = 1;
        header[16] = 2; // ET_EXEC
        assert_eq!(
            check_elf_bytes(&header).unwrap_err(),
            "not a shared library (ELF type 2)"
        );
    }

    #[test]
    fn tail_keeps_the_last_meaningful_lines() {
        let report =
            "header\n----\nlots\nof\nnoise\nmismatched type\nExpected: RStr<'a>\nFound: u32\n\n";
        assert_eq!(
            useful_tail(report),
            "mismatched type / Expected: RStr<'a> / Found: u32"
        );
    }
}
