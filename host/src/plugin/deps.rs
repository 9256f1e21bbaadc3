//! A plugin's shared-library dependencies under the plugin's own trust rules, and `$ORIGIN`.
//!
//! Before a plugin is loaded, every library it needs (DT_NEEDED) that the dynamic loader would
//! find through the plugin's DT_RUNPATH (or DT_RPATH), `$ORIGIN` expanded, is resolved here the
//! way glibc's `ld.so` resolves it, opened without following a final symlink and checked like the
//! plugin itself: owned by root or the current user, not writable by group or others, and every
//! directory above it too (a library's constructors run as the host's user at load time, before
//! any other check could happen). The same is done, recursively, for what those libraries need.
//! Libraries the dynamic loader would find elsewhere (the system's default paths, `ld.so.cache`)
//! are trusted as the system's, as is a library already loaded in the process (glibc reuses it
//! whatever the search path says). `LD_LIBRARY_PATH` is the operator's environment: not checked.
//! `$LIB` and `$PLATFORM` are not expanded: a search path using them is refused.
//!
//! Loading: the plugin is loaded through `/proc/self/fd/N` (exactly the file checked), where
//! glibc sets `$ORIGIN` to `/proc/self/fd`: a plugin with `RUNPATH=$ORIGIN` could no longer find
//! its bundled libraries. So the checked dependencies are loaded first, deepest first, each
//! through its own checked descriptor (`RTLD_NOW | RTLD_LOCAL`); when the plugin (or a
//! dependency) is then loaded, glibc finds each needed name already loaded and never searches:
//! it matches a needed name against the DT_SONAME of the loaded libraries, and a library found
//! by searching against the device and inode of the loaded ones.
//!
//! TOCTOU: each dependency is checked on the descriptor it is then loaded from, so the library
//! that runs is the one checked, whatever happens to its path after the checks. A dependency
//! whose SONAME is its needed name is matched by name and never looked up again. One whose
//! SONAME differs is looked up by glibc once more in the same directory; that path can only
//! change between the check and the load if someone who may write that directory (by the
//! checks: root or the host's own user, the same trust as for the plugin's own directory)
//! changes it. Through `$ORIGIN` that second lookup cannot work (glibc's `$ORIGIN` is
//! `/proc/self/fd` by then), so such a dependency is refused with a line saying to link it with
//! `-Wl,-soname,<name>`.
//!
//! Upstream has no equivalent (its providers are compiled into the binary).

use std::collections::HashSet;
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::loader::{directory_problem, fix_command, ownership_problem, read_elf, Dynamic};
use super::{LoaderOptions, Refusal};

/// At most this many libraries are resolved for one plugin (a loop guard; real plugins need a
/// handful).
const MAX_DEPENDENCIES: usize = 256;

/// A dependency checked and open, ready to be loaded by descriptor.
pub(super) struct Dependency {
    /// The needed name (DT_NEEDED).
    pub name: String,
    /// Where it was found (symlinks resolved).
    pub path: PathBuf,
    file: fs::File,
}

/// One search directory and the entry it came from (`RUNPATH $ORIGIN/lib`), for messages.
#[derive(Clone)]
struct SearchDir {
    dir: PathBuf,
    origin: bool,
    entry: String,
}

/// The dependencies of the plugin at `plugin` (its path with symlinks resolved; its dynamic
/// section `dynamic`) that must be checked, in load order (a library after what it needs). `Err`
/// is the one-line reason the plugin is refused.
pub(super) fn resolve(
    plugin: &Path,
    dynamic: &Dynamic,
    options: &LoaderOptions,
) -> Result<Vec<Dependency>, Refusal> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    seen.insert(plugin.to_path_buf());
    visit(plugin, dynamic, &[], options, &mut seen, &mut out)?;
    Ok(out)
}

fn visit(
    object: &Path,
    dynamic: &Dynamic,
    inherited_rpath: &[SearchDir],
    options: &LoaderOptions,
    seen: &mut HashSet<PathBuf>,
    out: &mut Vec<Dependency>,
) -> Result<(), Refusal> {
    let origin = object.parent().unwrap_or(Path::new("/"));
    // glibc: DT_RPATH of the object and of the objects that loaded it, unless the object has a
    // DT_RUNPATH, which then is the only path of its own (and is not passed on).
    let own_rpath = match (&dynamic.runpath, &dynamic.rpath) {
        (None, Some(rpath)) => search_dirs("RPATH", rpath, origin)?,
        _ => Vec::new(),
    };
    let mut rpath_chain: Vec<SearchDir> = own_rpath;
    if dynamic.runpath.is_none() {
        rpath_chain.extend(inherited_rpath.iter().cloned());
    }
    let mut dirs = rpath_chain.clone();
    if let Some(runpath) = &dynamic.runpath {
        dirs.extend(search_dirs("RUNPATH", runpath, origin)?);
    }
    if dirs.is_empty() && !dynamic.needed.iter().any(|n| n.contains('/')) {
        // Everything it needs comes from the system's paths.
        return Ok(());
    }
    for name in &dynamic.needed {
        let (candidate, via) = if name.contains('/') {
            (PathBuf::from(name), None)
        } else {
            if already_loaded(name) {
                continue;
            }
            match dirs.iter().find(|d| d.dir.join(name).exists()) {
                Some(d) => (d.dir.join(name), Some(d)),
                // Not in the object's own search path: the system's default paths.
                None => continue,
            }
        };
        let path = fs::canonicalize(&candidate).map_err(|e| Refusal::Dependency {
            name: name.clone(),
            location: candidate.display().to_string(),
            reason: format!("cannot be read: {e}"),
        })?;
        if !seen.insert(path.clone()) {
            continue;
        }
        if seen.len() > MAX_DEPENDENCIES {
            return Err(Refusal::SearchPath(format!(
                "it needs more than {MAX_DEPENDENCIES} libraries through its own search path"
            )));
        }
        let found = match via {
            Some(d) => format!("{}, found through {}", path.display(), d.entry),
            None => path.display().to_string(),
        };
        let dependency = |reason: String| Refusal::Dependency {
            name: name.clone(),
            location: found.clone(),
            reason,
        };
        let file = open_checked(&path, options).map_err(|problem| match problem {
            Problem::Insecure { problems, fixes } => Refusal::InsecureDependency {
                name: name.clone(),
                location: found.clone(),
                problems,
                fixes,
            },
            Problem::Other(reason) => dependency(reason),
        })?;
        let dep_dynamic = read_elf(&file)
            .map_err(|why| dependency(format!("is not a usable shared library ({why})")))?;
        if via.is_some_and(|d| d.origin) && dep_dynamic.soname.as_deref() != Some(name.as_str()) {
            return Err(dependency(format!(
                "has {}; a library found through $ORIGIN must have its needed name as SONAME \
                 (the host loads plugins by descriptor): relink it with -Wl,-soname,{name}",
                match &dep_dynamic.soname {
                    Some(s) => format!("the SONAME {s:?}"),
                    None => "no SONAME".to_string(),
                }
            )));
        }
        visit(&path, &dep_dynamic, &rpath_chain, options, seen, out)?;
        out.push(Dependency {
            name: name.clone(),
            path,
            file,
        });
    }
    Ok(())
}

/// The directories of a `:`-separated search path, `$ORIGIN` / `${ORIGIN}` replaced by
/// `origin`. An empty entry is the current directory, as for glibc.
fn search_dirs(kind: &str, path: &str, origin: &Path) -> Result<Vec<SearchDir>, Refusal> {
    let mut dirs = Vec::new();
    for entry in path.split(':') {
        let uses_origin = entry.contains("$ORIGIN") || entry.contains("${ORIGIN}");
        let expanded = entry
            .replace("${ORIGIN}", &origin.to_string_lossy())
            .replace("$ORIGIN", &origin.to_string_lossy());
        if expanded.contains('$') {
            return Err(Refusal::SearchPath(format!(
                "its {kind} entry {entry:?} uses a dynamic string token other than $ORIGIN \
                 ($LIB, $PLATFORM), which the host does not resolve; use $ORIGIN or an absolute path"
            )));
        }
        dirs.push(SearchDir {
            dir: PathBuf::from(if expanded.is_empty() { "." } else { &expanded }),
            origin: uses_origin,
            entry: format!("{kind} {entry}"),
        });
    }
    Ok(dirs)
}

/// Whether the dynamic loader already has a library of this needed name (it would reuse it
/// instead of searching).
#[allow(unsafe_code)] // dlopen with RTLD_NOLOAD
fn already_loaded(name: &str) -> bool {
    // SAFETY: RTLD_NOLOAD never maps or initialises a library: it only returns a handle to one
    // already loaded (dropping the handle gives back the reference it took).
    unsafe { libloading::os::unix::Library::open(Some(name), libc::RTLD_NOLOAD | libc::RTLD_LAZY) }
        .is_ok()
}

/// Open `path` (symlinks already resolved) without following a symlink and check it and the
/// directories above it as the plugin is checked; with `--allow-insecure-plugins` the problems
/// are warnings.
/// Why a dependency cannot be used.
enum Problem {
    Insecure {
        problems: Vec<String>,
        fixes: Vec<String>,
    },
    Other(String),
}

fn open_checked(path: &Path, options: &LoaderOptions) -> Result<fs::File, Problem> {
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| Problem::Other(format!("cannot be opened: {e}")))?;
    let meta = file
        .metadata()
        .map_err(|e| Problem::Other(format!("cannot be read: {e}")))?;
    if !meta.is_file() {
        return Err(Problem::Other("is not a regular file".into()));
    }
    let mut problems = Vec::new();
    let mut fixes = Vec::new();
    if let Some(problem) = ownership_problem(&meta) {
        problems.push(format!("the file {problem}"));
        fixes.push(fix_command(&meta, path));
    }
    for dir in path.ancestors().skip(1) {
        let dir_meta = fs::metadata(dir)
            .map_err(|e| Problem::Other(format!("cannot be checked: {}: {e}", dir.display())))?;
        if let Some(problem) = directory_problem(&dir_meta) {
            problems.push(format!("the directory {} {problem}", dir.display()));
            fixes.push(fix_command(&dir_meta, dir));
        }
    }
    if problems.is_empty() {
        return Ok(file);
    }
    if options.allow_insecure {
        for problem in &problems {
            tracing::warn!(library = %path.display(), "loading anyway (--allow-insecure-plugins): {problem}");
        }
        return Ok(file);
    }
    Err(Problem::Insecure { problems, fixes })
}

/// Load the checked dependencies, in order, each through its descriptor (kept open, as the
/// libraries are never unloaded). `Err` is the dynamic loader's reason, naming the library.
#[allow(unsafe_code)] // dlopen
pub(super) fn preload(deps: Vec<Dependency>) -> Result<(), Refusal> {
    for dep in deps {
        let fd_path = format!("/proc/self/fd/{}", dep.file.as_raw_fd());
        // SAFETY: loading runs the library's constructors: it passed the same trust checks as
        // the plugin (module comment).
        let library = unsafe {
            libloading::os::unix::Library::open(
                Some(&fd_path),
                libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_LOCAL,
            )
        }
        .map_err(|e| Refusal::Dependency {
            name: dep.name.clone(),
            location: dep.path.display().to_string(),
            reason: format!("cannot be loaded: {}", super::loader::dl_reason(&e)),
        })?;
        std::mem::forget(library);
        std::mem::forget(dep.file);
    }
    Ok(())
}
