//! Why a plugin file was refused: one variant per kind of reason, whose `Display` is the one
//! line the host prints (after the file's path) and `ccm-host plugins -o json` lists as
//! `reason`, with the variant's [`Refusal::kind`] as `kind`.

use std::fmt;
use std::path::PathBuf;

/// Why the loader refused a plugin file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The file could not be opened or read, or is not a regular file.
    Unreadable(String),
    /// The file, or a directory above it, could be changed by someone other than root or the
    /// current user.
    Insecure {
        /// Each problem, e.g. `the directory /x is writable by group or others (mode 777)`.
        problems: Vec<String>,
        /// The commands that fix them.
        fixes: Vec<String>,
    },
    /// Not an ELF shared library of this platform, or no plugin root module in it.
    NotAPlugin(String),
    /// The dynamic loader refused it (e.g. a missing library or symbol).
    Dlopen(String),
    /// Built with an abi_stable release whose header this host cannot read.
    AbiStableRelease,
    /// abi_stable's header check failed otherwise.
    AbiHeader(String),
    /// Built against another major version of ccm-provider-abi.
    AbiVersion {
        /// The plugin's ccm-provider-abi version.
        plugin: String,
        /// This host's major version.
        host_major: u32,
        /// What to rebuild against.
        advice: String,
    },
    /// The recorded ccm-provider-abi version does not parse.
    AbiVersionUnparsable(String),
    /// The root module's layout differs from this host's.
    InterfaceMismatch {
        /// `: <what differs>` (or ` (<the report's tail>)`).
        detail: String,
        /// What to rebuild against.
        advice: String,
    },
    /// The ABI 1.1 extension module's layout differs from this host's.
    ExtensionMismatch {
        /// What differs.
        detail: String,
        /// What to rebuild against.
        advice: String,
    },
    /// The ABI 1.2 extension module's layout differs from this host's.
    Extension12Mismatch {
        /// What differs.
        detail: String,
        /// What to rebuild against.
        advice: String,
    },
    /// It exports the ABI 1.2 extension without the 1.1 one every 1.2 plugin has.
    Extension12Without11,
    /// The root module failed to initialise for another reason.
    RootModuleInit(String),
    /// Built with `panic = "abort"`.
    PanicAbort,
    /// `register` did not return in time.
    RegisterTimeout(std::time::Duration),
    /// `register` returned an error (or panicked).
    RegisterFailed(String),
    /// `register` registered nothing.
    NoProviders,
    /// A registered provider name is empty, has spaces or control characters, or is too long.
    InvalidProviderName(String),
    /// The plugin registered one name twice.
    RegisteredTwice(String),
    /// Another file registers the same provider name: refused for all of them.
    DuplicateProvider {
        /// The name.
        name: String,
        /// Every file registering it.
        files: Vec<PathBuf>,
    },
    /// The plugin's RUNPATH/RPATH cannot be resolved (a token other than `$ORIGIN`, too many
    /// libraries).
    SearchPath(String),
    /// A library it needs through its own search path could be changed by someone other than
    /// root or the current user.
    InsecureDependency {
        /// The needed name.
        name: String,
        /// Where it was found, and through which search-path entry.
        location: String,
        /// Each problem.
        problems: Vec<String>,
        /// The commands that fix them.
        fixes: Vec<String>,
    },
    /// A library it needs through its own search path is unusable (unreadable, not ELF, no
    /// SONAME where `$ORIGIN` needs one, refused by the dynamic loader).
    Dependency {
        /// The needed name.
        name: String,
        /// Where it was found.
        location: String,
        /// What is wrong, as a predicate: `cannot be read: ...`.
        reason: String,
    },
}

impl Refusal {
    /// The variant's stable name, as listed by `ccm-host plugins -o json` (`kind`).
    pub fn kind(&self) -> &'static str {
        match self {
            Refusal::Unreadable(_) => "Unreadable",
            Refusal::Insecure { .. } => "Insecure",
            Refusal::NotAPlugin(_) => "NotAPlugin",
            Refusal::Dlopen(_) => "Dlopen",
            Refusal::AbiStableRelease => "AbiStableRelease",
            Refusal::AbiHeader(_) => "AbiHeader",
            Refusal::AbiVersion { .. } => "AbiVersion",
            Refusal::AbiVersionUnparsable(_) => "AbiVersionUnparsable",
            Refusal::InterfaceMismatch { .. } => "InterfaceMismatch",
            Refusal::ExtensionMismatch { .. } => "ExtensionMismatch",
            Refusal::Extension12Mismatch { .. } => "Extension12Mismatch",
            Refusal::Extension12Without11 => "Extension12Without11",
            Refusal::RootModuleInit(_) => "RootModuleInit",
            Refusal::PanicAbort => "PanicAbort",
            Refusal::RegisterTimeout(_) => "RegisterTimeout",
            Refusal::RegisterFailed(_) => "RegisterFailed",
            Refusal::NoProviders => "NoProviders",
            Refusal::InvalidProviderName(_) => "InvalidProviderName",
            Refusal::RegisteredTwice(_) => "RegisteredTwice",
            Refusal::DuplicateProvider { .. } => "DuplicateProvider",
            Refusal::SearchPath(_) => "SearchPath",
            Refusal::InsecureDependency { .. } => "InsecureDependency",
            Refusal::Dependency { .. } => "Dependency",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Unreadable(why) => f.write_str(why),
            Refusal::Insecure { problems, fixes } => write!(
                f,
                "refusing to load: {}; fix it with `{}` or pass --allow-insecure-plugins",
                problems.join("; "),
                fixes.join(" && ")
            ),
            Refusal::NotAPlugin(why) => write!(f, "is not a ccm-host provider plugin ({why})"),
            Refusal::Dlopen(why) => write!(f, "cannot be loaded as a shared library: {why}"),
            Refusal::AbiStableRelease => f.write_str(
                "was built with an incompatible abi_stable release; rebuild it against the \
                 ccm-provider-abi version this host uses",
            ),
            Refusal::AbiHeader(why) => write!(f, "abi_stable header check failed: {why}"),
            Refusal::AbiVersion {
                plugin,
                host_major,
                advice,
            } => write!(
                f,
                "was built against ccm-provider-abi {plugin}, this host loads {host_major}.x: {advice}"
            ),
            Refusal::AbiVersionUnparsable(v) => {
                write!(f, "records an unparsable ccm-provider-abi version {v:?}")
            }
            Refusal::InterfaceMismatch { detail, advice } => write!(
                f,
                "its plugin interface does not match this host{detail}; {advice}"
            ),
            Refusal::ExtensionMismatch { detail, advice } => write!(
                f,
                "its ABI 1.1 extension does not match this host: {detail}; {advice}"
            ),
            Refusal::Extension12Mismatch { detail, advice } => write!(
                f,
                "its ABI 1.2 extension does not match this host: {detail}; {advice}"
            ),
            Refusal::Extension12Without11 => write!(
                f,
                "exports the ABI 1.2 extension ({}) without the 1.1 extension ({}) every 1.2 \
                 plugin has; build it with ccm_provider_abi::export_plugin!",
                ccm_provider_abi::ext_v1_2::EXT_V1_2_SYMBOL,
                ccm_provider_abi::ext::EXT_V1_1_SYMBOL
            ),
            Refusal::RootModuleInit(why) => {
                write!(f, "its root module failed to initialise: {why}")
            }
            Refusal::PanicAbort => f.write_str(
                "was built with panic = \"abort\": its first panic would end the whole host; \
                 rebuild it with panic = \"unwind\" (the default) so the SDK can catch panics",
            ),
            Refusal::RegisterTimeout(deadline) => write!(
                f,
                "its register function did not return within {deadline:?} (it is left \
                 running on its own thread; the plugin is not used)"
            ),
            Refusal::RegisterFailed(why) => write!(f, "its register function failed: {why}"),
            Refusal::NoProviders => f.write_str("the plugin registered no providers"),
            Refusal::InvalidProviderName(name) => {
                if name.len() > super::MAX_PROVIDER_NAME {
                    write!(
                        f,
                        "the plugin registered a provider name of {} bytes (at most {}): {:?}…",
                        name.len(),
                        super::MAX_PROVIDER_NAME,
                        name.chars().take(32).collect::<String>()
                    )
                } else {
                    write!(
                        f,
                        "the plugin registered an invalid provider name {name:?} (empty or \
                         containing spaces)"
                    )
                }
            }
            Refusal::RegisteredTwice(name) => {
                write!(f, "the plugin registered provider {name:?} twice")
            }
            Refusal::DuplicateProvider { name, files } => {
                let files: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
                write!(
                    f,
                    "provider {name:?} is registered by {}; it is refused for all of them: \
                     remove all but one",
                    files.join(" and ")
                )
            }
            Refusal::SearchPath(why) => f.write_str(why),
            Refusal::InsecureDependency {
                name,
                location,
                problems,
                fixes,
            } => write!(
                f,
                "its dependency {name} ({location}): refusing to load it: {}; fix it with `{}` \
                 or pass --allow-insecure-plugins",
                problems.join("; "),
                fixes.join(" && ")
            ),
            Refusal::Dependency {
                name,
                location,
                reason,
            } => write!(f, "its dependency {name} ({location}) {reason}"),
        }
    }
}
