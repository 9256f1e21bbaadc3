//! Opening one plugin file: permission checks, dlopen, abi_stable's header / version / layout
//! checks, then the plugin's `register` entry function.

use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use abi_stable::library::{AbiHeaderRef, LibraryError, ROOT_MODULE_LOADER_NAME_WITH_NUL};
use ccm_provider_abi::abi::PluginModule_Ref;
use ccm_provider_abi::ext::{self, ExtV1_1Export, PanicStrategy, PluginExtV1_1_Ref};
use ccm_provider_abi::ext_v1_2::{self, ExtV1_2Export, PluginExtV1_2_Ref};

use super::registrar::HostRegistrar;
use super::{Factory, LoadedPlugin, Refusal, SelectError};

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
    pub registrations: Vec<(String, Factory)>,
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
    let meta = fs::metadata(dir).map_err(|e| {
        err(if e.kind() == std::io::ErrorKind::NotFound {
            format!(
                "{e}; name the directory of your plugins with --plugin-dir DIR (or CCM_PLUGIN_DIR)"
            )
        } else {
            e.to_string()
        })
    })?;
    if !meta.is_dir() {
        return Err(err("not a directory".into()));
    }
    if !options.allow_insecure {
        if let Some(problem) = ownership_problem(&meta) {
            return Err(SelectError::InsecureDirectory {
                path: dir.to_path_buf(),
                problem,
                fix: fix_command(&meta, dir),
            });
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

/// The command that fixes the ownership or mode problem of `path` (`chmod go-w`, else `chown`).
pub(super) fn fix_command(meta: &fs::Metadata, path: &Path) -> String {
    let quoted = shell_quote(&path.to_string_lossy());
    if meta.permissions().mode() & 0o022 != 0 {
        format!("chmod go-w {quoted}")
    } else {
        format!("chown \"$(id -u)\" {quoted}")
    }
}

/// `s` as one shell word.
fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+,:=@%".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

#[allow(unsafe_code)] // geteuid
pub(super) fn ownership_problem(meta: &fs::Metadata) -> Option<String> {
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

/// How long a plugin's `register` may take. It only registers factories, so anything longer
/// is a plugin that hangs: it is refused and the host starts (and stops) without it.
const REGISTER_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// Run `f` on a thread of its own and wait at most `deadline`: `None` when it did not return
/// (the thread is left behind; the process can still exit).
fn with_deadline<T: Send + 'static>(
    deadline: std::time::Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("ccm-plugin-register".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .ok()?;
    rx.recv_timeout(deadline).ok()
}

/// Open the plugin file for loading: the path resolved once (symlinks followed), the final
/// file opened without following a symlink, its owner and mode checked on the open descriptor,
/// and every directory above it checked as sudo and ssh do (owned by root or the current user,
/// not writable by group or others unless sticky). With `allow_insecure` each problem is a
/// warning instead of a refusal.
fn open_checked(path: &Path, options: &LoaderOptions) -> Result<(fs::File, PathBuf), Refusal> {
    let unreadable = |why: String| Refusal::Unreadable(why);
    let resolved =
        fs::canonicalize(path).map_err(|e| unreadable(format!("cannot read the file: {e}")))?;
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(&resolved)
        .map_err(|e| unreadable(format!("cannot open {}: {e}", resolved.display())))?;
    let meta = file
        .metadata()
        .map_err(|e| unreadable(format!("cannot read the file: {e}")))?;
    if !meta.is_file() {
        return Err(unreadable("not a regular file".into()));
    }
    let mut problems = Vec::new();
    let mut fixes = Vec::new();
    if let Some(problem) = ownership_problem(&meta) {
        let target = if resolved == path {
            "the file".to_string()
        } else {
            format!("its target {}", resolved.display())
        };
        problems.push(format!("{target} {problem}"));
        fixes.push(fix_command(&meta, &resolved));
    }
    for dir in resolved.ancestors().skip(1) {
        let dir_meta = fs::metadata(dir)
            .map_err(|e| unreadable(format!("cannot read {}: {e}", dir.display())))?;
        if let Some(problem) = directory_problem(&dir_meta) {
            problems.push(format!("the directory {} {problem}", dir.display()));
            fixes.push(fix_command(&dir_meta, dir));
        }
    }
    if problems.is_empty() {
        return Ok((file, resolved));
    }
    if options.allow_insecure {
        for problem in &problems {
            tracing::warn!(plugin = %path.display(), "loading anyway (--allow-insecure-plugins): {problem}");
        }
        return Ok((file, resolved));
    }
    Err(Refusal::Insecure { problems, fixes })
}

/// A directory above a plugin is unsafe when someone other than root or the current user could
/// replace what it holds: another owner, or writable by group/others without the sticky bit.
#[allow(unsafe_code)] // geteuid
pub(super) fn directory_problem(meta: &fs::Metadata) -> Option<String> {
    let mode = meta.permissions().mode();
    let sticky = mode & 0o1000 != 0;
    if mode & 0o022 != 0 && !sticky {
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
#[allow(unsafe_code)] // dlopen and reading the plugin's exported symbols
pub(super) fn load(path: &Path, options: &LoaderOptions) -> Result<Loaded, Refusal> {
    let (file, resolved) = open_checked(path, options)?;
    let dynamic = check_elf(&file)?;
    // The libraries it needs through its own search path, checked like the plugin and loaded
    // by descriptor before it (deps.rs: also what makes `$ORIGIN` work).
    let dependencies = super::deps::resolve(&resolved, &dynamic, options)?;
    crate::runtime::crash::in_plugin(path, "loading its dependencies", || {
        super::deps::preload(dependencies)
    })?;

    // Load exactly the file that was checked: through its open descriptor, so that a path
    // swapped after the checks (a symlink, a rename) cannot substitute another library.
    // RTLD_NOW: a missing shared-library dependency or symbol fails here, at start-up, with the
    // path, rather than at the first call. RTLD_LOCAL: plugins cannot see each other's symbols.
    let fd_path = format!("/proc/self/fd/{}", file.as_raw_fd());
    // SAFETY: loading a library runs its initialisers (ELF constructors) before any check of
    // its contents: the permission checks above are the trust boundary (docs/writing-a-provider.md).
    let library = crate::runtime::crash::in_plugin(path, "loading", || unsafe {
        libloading::os::unix::Library::open(
            Some(&fd_path),
            libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_LOCAL,
        )
    })
    .map_err(|e| Refusal::Dlopen(dl_reason(&e)))?;
    // The dynamic loader knows this library by the name /proc/self/fd/N and would hand it out
    // again for a later dlopen of the same name: keep the descriptor (and so the number) for
    // the life of the process, as the library itself is never unloaded.
    std::mem::forget(file);

    // SAFETY: the symbol, when present, is abi_stable's `AbiHeaderRef` static; its type is
    // verified by `upgrade` (abi_stable version + C ABI self-tests) before anything else is read.
    let header: AbiHeaderRef = unsafe {
        match library.get::<AbiHeaderRef>(ROOT_MODULE_LOADER_NAME_WITH_NUL.as_bytes()) {
            Ok(symbol) => *symbol,
            Err(_) => {
                return Err(Refusal::NotAPlugin(
                    "it exports no plugin root module; build it with \
                     ccm_provider_abi::export_plugin!"
                        .into(),
                ))
            }
        }
    };
    // ABI 1.1 extension module, when the plugin exports one (a 1.0 plugin does not).
    // SAFETY: the symbol is generated by `export_plugin!` with exactly this signature; what it
    // returns is only read after its layout passed abi_stable's checker below.
    let ext_fn: Option<extern "C" fn() -> ExtV1_1Export> = unsafe {
        library
            .get::<extern "C" fn() -> ExtV1_1Export>(
                format!("{}\0", ext::EXT_V1_1_SYMBOL).as_bytes(),
            )
            .ok()
            .map(|symbol| *symbol)
    };
    // ABI 1.2 extension module, when the plugin exports one.
    // SAFETY: as for the 1.1 module: generated by `export_plugin!` with exactly this signature,
    // and what it returns is only read after its layout passed abi_stable's checker.
    let ext_v1_2_fn: Option<extern "C" fn() -> ExtV1_2Export> = unsafe {
        library
            .get::<extern "C" fn() -> ExtV1_2Export>(
                format!("{}\0", ext_v1_2::EXT_V1_2_SYMBOL).as_bytes(),
            )
            .ok()
            .map(|symbol| *symbol)
    };
    // Plugins are never unloaded (abi_stable keeps 'static references into them).
    std::mem::forget(library);

    let lib_header = header.upgrade().map_err(|e| match e {
        LibraryError::InvalidAbiHeader(_) => Refusal::AbiStableRelease,
        other => Refusal::AbiHeader(first_line(&other.to_string())),
    })?;

    let mut abi_version = lib_header.version_strings().version.to_string();
    check_version(&abi_version)?;

    let module: PluginModule_Ref =
        lib_header
            .init_root_module::<PluginModule_Ref>()
            .map_err(|e| match &e {
                LibraryError::AbiInstability(_)
                | LibraryError::IncompatibleVersionNumber { .. } => {
                    let full = e.to_string();
                    tracing::debug!(plugin = %path.display(), "full ABI report:\n{full}");
                    Refusal::InterfaceMismatch {
                        detail: root_mismatch(lib_header.layout())
                            .unwrap_or_else(|| format!(" ({})", useful_tail(&full))),
                        advice: rebuild_advice(),
                    }
                }
                other => Refusal::RootModuleInit(first_line(&other.to_string())),
            })?;

    let registrar = HostRegistrar::new(path, options.max_log_level);
    let result = match (ext_fn, ext_v1_2_fn) {
        (None, Some(_)) => return Err(Refusal::Extension12Without11),
        (Some(ext_fn), Some(ext_v1_2_fn)) => {
            // The 1.1 module still carries the panic strategy.
            check_ext_v1_1(path, ext_fn())?;
            let ext_module = check_ext_v1_2(path, ext_v1_2_fn())?;
            abi_version = ext_module.abi_version().to_string();
            check_version(&abi_version)?;
            let (register, abi) = (ext_module.register(), registrar.to_abi_v1_2());
            let plugin = path.to_path_buf();
            with_deadline(REGISTER_DEADLINE, move || {
                crate::runtime::crash::in_plugin(&plugin, "register", || register(abi))
            })
        }
        (Some(ext_fn), None) => {
            let ext_module = check_ext_v1_1(path, ext_fn())?;
            abi_version = ext_module.abi_version().to_string();
            check_version(&abi_version)?;
            let (register, abi) = (ext_module.register(), registrar.to_abi_v1_1());
            let plugin = path.to_path_buf();
            with_deadline(REGISTER_DEADLINE, move || {
                crate::runtime::crash::in_plugin(&plugin, "register", || register(abi))
            })
        }
        (None, None) => {
            let (register, abi) = (module.register(), registrar.to_abi());
            let plugin = path.to_path_buf();
            with_deadline(REGISTER_DEADLINE, move || {
                crate::runtime::crash::in_plugin(&plugin, "register", || register(abi))
            })
        }
    };
    let registrations = registrar.take();
    match result {
        None => return Err(Refusal::RegisterTimeout(REGISTER_DEADLINE)),
        Some(r) => {
            if let Err(e) = r.into_result() {
                return Err(Refusal::RegisterFailed(e.to_string()));
            }
        }
    }
    Ok(Loaded {
        info: LoadedPlugin {
            path: path.to_path_buf(),
            plugin_name: module.plugin_name().to_string(),
            plugin_version: module.plugin_version().to_string(),
            abi_version,
            providers: Vec::new(),
        },
        registrations,
    })
}

/// Check the 1.1 extension module a plugin exported: its layout against this host's, then
/// the plugin's panic strategy.
fn check_ext_v1_1(path: &Path, export: ExtV1_1Export) -> Result<PluginExtV1_1_Ref, Refusal> {
    if let Err(errors) = abi_stable::abi_stability::abi_checking::check_layout_compatibility(
        ext::expected_layout(),
        export.layout,
    ) {
        tracing::debug!(plugin = %path.display(), "full ABI report of the 1.1 extension:\n{errors}");
        return Err(Refusal::ExtensionMismatch {
            detail: describe_mismatch(&errors),
            advice: rebuild_advice(),
        });
    }
    let module = export.module;
    if module.panic_strategy() == PanicStrategy::ABORT {
        return Err(Refusal::PanicAbort);
    }
    Ok(module)
}

/// Check the 1.2 extension module a plugin exported: its layout against this host's.
fn check_ext_v1_2(path: &Path, export: ExtV1_2Export) -> Result<PluginExtV1_2_Ref, Refusal> {
    if let Err(errors) = abi_stable::abi_stability::abi_checking::check_layout_compatibility(
        ext_v1_2::expected_layout(),
        export.layout,
    ) {
        tracing::debug!(plugin = %path.display(), "full ABI report of the 1.2 extension:\n{errors}");
        return Err(Refusal::Extension12Mismatch {
            detail: describe_mismatch(&errors),
            advice: rebuild_advice(),
        });
    }
    Ok(export.module)
}

/// Validate the ELF header and program headers before `dlopen`: the dynamic loader maps
/// segments straight from the file, so a truncated library would crash the host with SIGBUS
/// instead of failing cleanly. Reads only the header, the program header table and the dynamic
/// section with its string table from the open file (a 1 GiB file costs a few small reads, not
/// 1 GiB of memory), and returns what the dynamic section says about dependencies.
///
/// Parsed here rather than with the `object` crate: `object` is in the tree only as a build
/// dependency (of psm, through ar_archive_writer), so using it would compile it again for the
/// host, for the three tables this function already walks.
fn check_elf(file: &fs::File) -> Result<Dynamic, Refusal> {
    read_elf(file).map_err(Refusal::NotAPlugin)
}

/// [`check_elf`]'s checks with the bare reason (used for dependencies too).
pub(super) fn read_elf(file: &fs::File) -> Result<Dynamic, String> {
    use std::os::unix::fs::FileExt;
    let len = file
        .metadata()
        .map_err(|e| format!("cannot read the file: {e}"))?
        .len();
    let mut read = |offset: u64, size: usize| -> std::io::Result<Vec<u8>> {
        let mut buf = vec![0u8; size];
        let mut filled = 0;
        while filled < size {
            match file.read_at(&mut buf[filled..], offset + filled as u64)? {
                0 => break,
                n => filled += n,
            }
        }
        buf.truncate(filled);
        Ok(buf)
    };
    check_elf_with(len, &mut read)
}

/// [`check_elf`] over an in-memory file (tests).
#[cfg(test)]
fn check_elf_bytes(b: &[u8]) -> Result<Dynamic, String> {
    let mut read = |offset: u64, size: usize| -> std::io::Result<Vec<u8>> {
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(b.len());
        Ok(b[start..(start + size).min(b.len())].to_vec())
    };
    check_elf_with(b.len() as u64, &mut read)
}

/// The ELF checks, reading `size` bytes at `offset` of a file of `len` bytes through `read`.
fn check_elf_with(
    len: u64,
    read: &mut dyn FnMut(u64, usize) -> std::io::Result<Vec<u8>>,
) -> Result<Dynamic, String> {
    const HEADER: usize = 64;
    let io = |e: std::io::Error| format!("cannot read the file: {e}");
    let b = read(0, HEADER).map_err(io)?;
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
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    let u32_at = |b: &[u8], o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    let u64_at = |b: &[u8], o: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[o..o + 8]);
        u64::from_le_bytes(a)
    };
    let e_type = u16_at(&b, 16);
    if e_type != 3 {
        return Err(format!("not a shared library (ELF type {e_type})"));
    }
    let machine = u16_at(&b, 18);
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
    let (phoff, phentsize, phnum) = (
        u64_at(&b, 32),
        u64::from(u16_at(&b, 54)),
        u64::from(u16_at(&b, 56)),
    );
    let table_size = phentsize.saturating_mul(phnum);
    let table_end = phoff.checked_add(table_size);
    if phentsize < 56 || table_end.is_none_or(|end| end > len) {
        return Err(format!(
            "truncated or corrupt: program headers lie outside the {len}-byte file"
        ));
    }
    // At most 65,535 entries of a few dozen bytes: a few MiB in the worst case.
    let table = read(
        phoff,
        usize::try_from(table_size).map_err(|_| "corrupt program header table")?,
    )
    .map_err(io)?;
    if (table.len() as u64) < table_size {
        return Err(format!(
            "truncated or corrupt: program headers lie outside the {len}-byte file"
        ));
    }
    // (p_vaddr, p_offset, p_filesz) of each loadable segment, and the dynamic segment.
    let mut loads = Vec::new();
    let mut dynamic_segment = None;
    for i in 0..phnum {
        let ph = usize::try_from(i * phentsize).map_err(|_| "corrupt program header offset")?;
        let p_type = u32_at(&table, ph);
        let (offset, vaddr, filesz) = (
            u64_at(&table, ph + 8),
            u64_at(&table, ph + 16),
            u64_at(&table, ph + 32),
        );
        if matches!(p_type, 1 | 2) && offset.checked_add(filesz).is_none_or(|end| end > len) {
            return Err(format!(
                "truncated: a {} segment ends at byte {} but the file has {len} bytes",
                if p_type == 1 { "loadable" } else { "dynamic" },
                offset.saturating_add(filesz)
            ));
        }
        match p_type {
            1 => loads.push((vaddr, offset, filesz)),
            2 => dynamic_segment = Some((offset, filesz)),
            _ => {}
        }
    }
    match dynamic_segment {
        Some((offset, size)) => read_dynamic(offset, size, &loads, read),
        None => Ok(Dynamic::default()),
    }
}

/// What a shared library's dynamic section says about the libraries it needs: its DT_NEEDED
/// names, its own DT_SONAME, and where it asks the dynamic loader to look (DT_RPATH,
/// DT_RUNPATH; `None` when absent).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Dynamic {
    pub needed: Vec<String>,
    pub soname: Option<String>,
    pub rpath: Option<String>,
    pub runpath: Option<String>,
}

/// Parse the dynamic segment (`size` bytes at `offset`): 16-byte (tag, value) entries up to
/// DT_NULL. The strings live in the string table, which the section names by virtual address:
/// mapped back to a file offset through the loadable segment that holds it.
fn read_dynamic(
    offset: u64,
    size: u64,
    loads: &[(u64, u64, u64)],
    read: &mut dyn FnMut(u64, usize) -> std::io::Result<Vec<u8>>,
) -> Result<Dynamic, String> {
    const DT_NULL: u64 = 0;
    const DT_NEEDED: u64 = 1;
    const DT_STRTAB: u64 = 5;
    const DT_STRSZ: u64 = 10;
    const DT_SONAME: u64 = 14;
    const DT_RPATH: u64 = 15;
    const DT_RUNPATH: u64 = 29;
    // A dynamic section has a few dozen entries; a string table a few KiB (a big C++ library:
    // a few MiB). Larger is a corrupt file, not worth the memory.
    const MAX_DYNAMIC: u64 = 1 << 20;
    const MAX_STRTAB: u64 = 64 << 20;
    let io = |e: std::io::Error| format!("cannot read the file: {e}");
    if size > MAX_DYNAMIC {
        return Err(format!("corrupt: a dynamic section of {size} bytes"));
    }
    let bytes = read(offset, size as usize).map_err(io)?;
    let mut entries = Vec::new();
    for entry in bytes.chunks_exact(16) {
        let tag = u64::from_le_bytes(entry[..8].try_into().expect("8 bytes"));
        let value = u64::from_le_bytes(entry[8..].try_into().expect("8 bytes"));
        if tag == DT_NULL {
            break;
        }
        entries.push((tag, value));
    }
    let find = |wanted: u64| entries.iter().find(|(t, _)| *t == wanted).map(|(_, v)| *v);
    let string_offsets: Vec<&(u64, u64)> = entries
        .iter()
        .filter(|(t, _)| matches!(*t, DT_NEEDED | DT_SONAME | DT_RPATH | DT_RUNPATH))
        .collect();
    if string_offsets.is_empty() {
        return Ok(Dynamic::default());
    }
    let (Some(strtab), Some(strsz)) = (find(DT_STRTAB), find(DT_STRSZ)) else {
        return Err("corrupt: its dynamic section names libraries but has no string table".into());
    };
    if strsz > MAX_STRTAB {
        return Err(format!("corrupt: a string table of {strsz} bytes"));
    }
    let file_offset = loads
        .iter()
        .find(|(vaddr, _, filesz)| {
            strtab >= *vaddr
                && strtab
                    .checked_add(strsz)
                    .is_some_and(|end| end <= vaddr.saturating_add(*filesz))
        })
        .map(|(vaddr, offset, _)| strtab - vaddr + offset)
        .ok_or("corrupt: its string table lies outside its loadable segments")?;
    let strings = read(file_offset, strsz as usize).map_err(io)?;
    let string = |at: u64| -> Result<String, String> {
        let tail = usize::try_from(at)
            .ok()
            .and_then(|at| strings.get(at..))
            .ok_or("corrupt: a dynamic string lies outside the string table")?;
        let end = tail
            .iter()
            .position(|b| *b == 0)
            .ok_or("corrupt: an unterminated dynamic string")?;
        Ok(String::from_utf8_lossy(&tail[..end]).into_owned())
    };
    let mut dynamic = Dynamic::default();
    for (tag, value) in string_offsets {
        let text = string(*value)?;
        match *tag {
            DT_NEEDED => dynamic.needed.push(text),
            DT_SONAME => dynamic.soname = Some(text),
            DT_RPATH => dynamic.rpath = Some(text),
            _ => dynamic.runpath = Some(text),
        }
    }
    Ok(dynamic)
}

/// The dynamic loader's own reason (libloading's `Display` is only "dlopen failed"; dlerror's
/// text is the error's source), without the path it repeats.
pub(super) fn dl_reason(e: &libloading::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text = s.to_string();
        source = s.source();
    }
    // dlerror starts with the path it was given (here /proc/self/fd/N); keep what follows it.
    match text.split_once(": ") {
        Some((path, tail)) if path.starts_with('/') && !tail.is_empty() => tail.to_string(),
        _ => text,
    }
}

/// This host's ABI version: (major, minor) of the ccm-provider-abi it was built with.
fn host_abi() -> (u32, u32) {
    parse_version(ccm_provider_abi::ABI_VERSION).expect("own version parses")
}

/// The versions this host loads, as advice: `rebuild it against ccm-provider-abi 1.x, x <= 2`.
pub fn rebuild_advice() -> String {
    let (major, minor) = host_abi();
    format!("rebuild it against ccm-provider-abi {major}.x, x <= {minor}")
}

/// Any plugin of the host's major version loads: older minors through the frozen 1.0 interface
/// and the extension modules they have, newer ones with the extensions this host knows.
fn check_version(plugin: &str) -> Result<(), Refusal> {
    let (major, _) = host_abi();
    let parsed =
        parse_version(plugin).ok_or_else(|| Refusal::AbiVersionUnparsable(plugin.to_string()))?;
    if parsed.0 != major {
        return Err(Refusal::AbiVersion {
            plugin: plugin.to_string(),
            host_major: major,
            advice: rebuild_advice(),
        });
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

/// `: <what differs>` about a root module abi_stable refused: its layout (recorded in the
/// library header) checked again with abi_stable's checker, whose structured errors say the
/// type, where it is and both sides (its report says the same in 2,000 lines). `None` when the
/// layout is not recorded or the mismatch is not one of layout (a version number).
fn root_mismatch(layout: Option<&'static abi_stable::type_layout::TypeLayout>) -> Option<String> {
    let errors = abi_stable::abi_stability::abi_checking::check_layout_compatibility(
        <PluginModule_Ref as abi_stable::StableAbi>::LAYOUT,
        layout?,
    )
    .err()?;
    Some(format!(": {}", describe_mismatch(&errors)))
}

/// One line about the layout mismatch abi_stable found, from its structured errors: the type,
/// where it is used (the trait method and argument, or the struct field, that lead to it from
/// the plugin's module) and what differs on both sides, e.g. `type CallContext (argument ctx of
/// AbiCloudProvider::initialize): 3 fields in the plugin, 2 in this host`. The deepest error is
/// the cause; the ones above it only say that a type holding it differs too.
fn describe_mismatch(
    errors: &abi_stable::abi_stability::abi_checking::AbiInstabilityErrors,
) -> String {
    use abi_stable::type_layout::TLFieldOrFunction;
    let Some(err) = errors
        .errors
        .iter()
        .filter(|e| !e.errs.is_empty())
        .max_by_key(|e| e.stack_trace.len())
    else {
        return format!("type {} differs", errors.interface.name());
    };
    // Walk from the module down to the mismatched type, remembering the last trait object,
    // method, argument and struct field passed on the way (abi_stable's own wrapper types, the
    // vtables and references in between, are not worth naming).
    const WRAPPERS: &[&str] = &[
        "PrefixRef",
        "&",
        "&mut",
        "RObject",
        "RResult",
        "ROption",
        "RVec",
        "RSlice",
        "RBox",
        "RArc",
        "RStr",
        "RString",
        "NonNull",
    ];
    let mut owner = errors.interface.name().to_string();
    let mut ty = owner.clone();
    let (mut object, mut method, mut argument, mut field) = (None, None, None, None);
    for step in err.stack_trace.iter() {
        // Function steps only repeat the field that holds the function pointer. The parameter
        // names abi_stable records for trait methods are generated (`param_0`, ...), so an
        // argument is named by its method only.
        if let TLFieldOrFunction::Field(f) = &step.expected {
            let name = f.name();
            if let Some(trait_name) = owner.strip_suffix("_TO") {
                object = Some(trait_name.to_string());
                (method, argument, field) = (None, None, None);
            } else if owner == "VTable" {
                method = Some(name.to_string());
                (argument, field) = (None, None);
            } else if owner == "AFunctionPointer" {
                argument = Some(if name == "__returns" {
                    "the return value"
                } else {
                    "an argument"
                });
                field = None;
            } else if !WRAPPERS.contains(&owner.as_str()) {
                field = Some(format!("field {owner}.{name}"));
            }
            owner = f.layout().name().to_string();
            ty = owner.clone();
        }
    }
    let mut place: Vec<String> = Vec::new();
    place.extend(field);
    match (object, method) {
        (Some(o), Some(m)) => {
            let call = format!("{o}::{m}");
            place.push(match argument {
                Some(a) => format!("{a} of {call}"),
                None => call,
            });
        }
        (Some(o), None) => place.push(format!("in {o}")),
        _ => {}
    }
    if place.is_empty() && err.stack_trace.len() <= 1 {
        place.push("the plugin's root module".to_string());
    }
    let at = if place.is_empty() {
        String::new()
    } else {
        format!(" ({})", place.join(", "))
    };
    // The differences in the type itself first; its size and alignment only when nothing else
    // explains them.
    let mut what: Vec<(u8, String)> = err.errs.iter().filter_map(instability).collect();
    if what.iter().any(|(rank, _)| *rank == 0) {
        what.retain(|(rank, _)| *rank == 0);
    }
    let what: Vec<String> = what.into_iter().map(|(_, w)| w).collect();
    let what = if what.is_empty() {
        "its layout differs".to_string()
    } else {
        what.join(", ")
    };
    format!("type {ty}{at}: {what}")
}

/// One difference, "plugin side, host side" (abi_stable's `expected` is this host's layout,
/// `found` the plugin's), ranked: 0 for what the type is made of, 1 for its size and alignment,
/// which follow from that.
fn instability(
    i: &abi_stable::abi_stability::abi_checking::AbiInstability,
) -> Option<(u8, String)> {
    use abi_stable::abi_stability::abi_checking::AbiInstability as AI;
    let both = |what: &str, plugin: String, host: String| {
        format!("{what} {plugin} in the plugin, {host} in this host")
    };
    let text = match i {
        AI::FieldCountMismatch(v) => format!(
            "{} fields in the plugin, {} in this host",
            v.found, v.expected
        ),
        AI::MismatchedPrefixSize(v) => format!(
            "{} fields before the optional ones in the plugin, {} in this host",
            v.found, v.expected
        ),
        AI::Name(v) => both("type", v.found.to_string(), v.expected.to_string()),
        AI::UnexpectedField(v) => both(
            "field",
            format!("{}: {}", v.found.name(), v.found.full_type()),
            format!("{}: {}", v.expected.name(), v.expected.full_type()),
        ),
        AI::Package(v) => both("package", v.found.to_string(), v.expected.to_string()),
        AI::PackageVersion(v) => both(
            "package version",
            v.found.to_string(),
            v.expected.to_string(),
        ),
        AI::NonZeroness(v) => both("non-zero", v.found.to_string(), v.expected.to_string()),
        AI::GenericParamCount(v) => both(
            "generic parameters",
            v.found.to_string(),
            v.expected.to_string(),
        ),
        AI::TLDataDiscriminant(v) => both(
            "kind",
            format!("{:?}", v.found),
            format!("{:?}", v.expected),
        ),
        AI::MismatchedPrimitive(v) => both(
            "primitive",
            format!("{:?}", v.found),
            format!("{:?}", v.expected),
        ),
        AI::TooManyVariants(v) => format!(
            "{} variants in the plugin, {} in this host",
            v.found, v.expected
        ),
        AI::UnexpectedVariant(v) => both("variant", v.found.to_string(), v.expected.to_string()),
        AI::ReprAttr(v) => both(
            "repr",
            format!("{:?}", v.found),
            format!("{:?}", v.expected),
        ),
        AI::FnQualifierMismatch(_) => "function qualifiers (unsafe, ...) differ".to_string(),
        AI::FnLifetimeMismatch(_) | AI::FieldLifetimeMismatch(_) => {
            "the lifetimes it references differ".to_string()
        }
        AI::Size(v) => {
            return Some((
                1,
                both(
                    "size",
                    format!("{} bytes", v.found),
                    format!("{} bytes", v.expected),
                ),
            ))
        }
        AI::Alignment(v) => {
            return Some((
                1,
                both("alignment", v.found.to_string(), v.expected.to_string()),
            ))
        }
        _ => return None,
    };
    Some((0, text))
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

    extern "C" fn no_register(
        _: ccm_provider_abi::ext_v1_2::ExtRegistrarV1_2Box,
    ) -> ccm_provider_abi::abi::AbiResult<()> {
        abi_stable::std_types::RResult::ROk(())
    }

    fn ext_v1_2_module() -> PluginExtV1_2_Ref {
        use abi_stable::prefix_type::PrefixTypeTrait;
        ext_v1_2::PluginExtV1_2 {
            abi_version: abi_stable::std_types::RStr::from_str("1.2.0"),
            register: no_register,
        }
        .leak_into_prefix()
    }

    #[test]
    fn the_1_2_extension_is_checked_on_its_own_layout() {
        let path = Path::new("/plugins/libx.so");
        let ok = ExtV1_2Export {
            layout: ext_v1_2::expected_layout(),
            module: ext_v1_2_module(),
        };
        let module = check_ext_v1_2(path, ok).expect("the host's own layout passes");
        assert_eq!(module.abi_version().as_str(), "1.2.0");
        // A module whose layout is another type's (here the 1.1 module's) is refused with one
        // line naming what differs.
        let other = ExtV1_2Export {
            layout: ext::expected_layout(),
            module: ext_v1_2_module(),
        };
        let Err(err) = check_ext_v1_2(path, other) else {
            panic!("a foreign layout is refused")
        };
        assert!(
            matches!(&err, Refusal::Extension12Mismatch { advice, .. } if *advice == rebuild_advice()),
            "{err}"
        );
        assert_eq!(err.to_string().lines().count(), 1, "{err}");
    }

    #[test]
    fn version_policy_same_major_any_minor() {
        assert!(check_version("1.0.0").is_ok());
        assert!(check_version("1.1.0").is_ok());
        assert!(check_version("1.3.2").is_ok());
        let err = check_version("0.9.0").unwrap_err();
        assert!(
            matches!(&err, Refusal::AbiVersion { plugin, host_major: 1, .. } if plugin == "0.9.0"),
            "{err:?}"
        );
        assert!(
            err.to_string().starts_with(
                "was built against ccm-provider-abi 0.9.0, this host loads 1.x: rebuild it \
                 against ccm-provider-abi 1.x, x <= "
            ),
            "{err}"
        );
        assert!(matches!(
            check_version("2.0.0"),
            Err(Refusal::AbiVersion { .. })
        ));
        assert_eq!(
            check_version("garbage"),
            Err(Refusal::AbiVersionUnparsable("garbage".into()))
        );
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
