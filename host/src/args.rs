//! Argument groups that several commands share (`run`, `plugins`, `check`), so that the
//! commands do not import each other or the top-level command line (`cli`).

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use crate::plugin::LoaderOptions;

/// The plugin directory of the image (`deploy/Dockerfile`): the default of `--plugin-dir`.
pub const DEFAULT_PLUGIN_DIR: &str = "/usr/lib/ccm-host/plugins";

/// The help heading of the plugin flags.
const PLUGIN_HEADING: &str = "Plugins (ccm-host)";

/// Where plugins come from (shared by every command that loads them).
#[derive(Debug, Clone, Args)]
pub struct PluginDirArgs {
    /// Directory of provider plugin `.so` files (repeatable; every `*.so` is loaded, sorted).
    #[arg(
        long = "plugin-dir",
        env = "CCM_PLUGIN_DIR",
        value_delimiter = ':',
        default_value = DEFAULT_PLUGIN_DIR,
        help_heading = PLUGIN_HEADING
    )]
    pub plugin_dirs: Vec<PathBuf>,
    /// Load plugin files or directories writable by group/others or owned by another user.
    #[arg(long, help_heading = PLUGIN_HEADING)]
    pub allow_insecure_plugins: bool,
}

impl PluginDirArgs {
    /// Loader options for these arguments at the given host log level.
    pub fn loader_options(&self, max_log_level: u8) -> LoaderOptions {
        LoaderOptions {
            allow_insecure: self.allow_insecure_plugins,
            max_log_level,
        }
    }
}

/// Output format of listings.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum OutputFormat {
    /// A table.
    Text,
    /// JSON.
    Json,
}

/// The largest `--cloud-config` or `--scenario` file read (16 MiB): a cloud config is a few KB,
/// a fake cloud of 5,000 instances about 500 KB; a 100 MB file cost about 240 MB of memory to
/// parse, near a 256 Mi container limit.
pub const MAX_INPUT_FILE: u64 = 16 * 1024 * 1024;

/// Read an input file of at most [`MAX_INPUT_FILE`] bytes; a larger one is an error saying so
/// (without reading more than one byte past the limit).
pub fn read_input_file(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_INPUT_FILE + 1)
        .read_to_end(&mut out)?;
    if out.len() as u64 > MAX_INPUT_FILE {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "larger than {} MiB, the most accepted",
                MAX_INPUT_FILE / (1024 * 1024)
            ),
        ));
    }
    if let Some(problem) = nesting_problem(&out, MAX_INPUT_NESTING) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            problem,
        ));
    }
    Ok(out)
}

/// The deepest nesting of an input file accepted (YAML, JSON or INI). The YAML parser the
/// providers and the sandbox use refuses more than 128 levels itself, but only after its
/// scanner, whose cost grows with the square of the depth (50,000 levels: 17 s in a debug
/// build), has read the whole file; files deeper than this are refused first, in one linear
/// pass. Well above 128, so that the estimate below never refuses what the parser accepts.
pub const MAX_INPUT_NESTING: usize = 512;

/// `Some(reason)` when `text` nests deeper than `limit`, estimated in one pass over the bytes
/// (linear in the size; no allocation but the stack of block indentations): the block
/// structure's depth (the stack of indentations of the lines, plus `- ` entries opened on one
/// line) plus the flow depth (`[` and `{` that open a node: at the start of a value, not inside
/// a plain scalar, a quoted string, a comment or a block scalar's content).
pub fn nesting_problem(text: &[u8], limit: usize) -> Option<String> {
    let mut indents: Vec<usize> = Vec::new();
    let mut flow = 0usize;
    // Inside a quoted scalar (its quote character), which may span lines.
    let mut quote: Option<u8> = None;
    // Inside a block scalar's content: the indentation of the line that opened it.
    let mut block_scalar: Option<usize> = None;
    for (number, line) in text.split(|b| *b == b'\n').enumerate() {
        let indent = line.iter().take_while(|b| **b == b' ').count();
        let rest = &line[indent..];
        let blank = rest.iter().all(|b| b.is_ascii_whitespace());
        if let Some(opener) = block_scalar {
            if blank || indent > opener {
                continue;
            }
            block_scalar = None;
        }
        let mut depth_here = 0usize;
        if quote.is_none() && flow == 0 {
            if blank || rest.first() == Some(&b'#') {
                continue;
            }
            while indents.last().is_some_and(|top| *top > indent) {
                indents.pop();
            }
            if indents.last() != Some(&indent) {
                indents.push(indent);
            }
        }
        let base = indents.len();
        let too_deep = |depth: usize| {
            (depth > limit).then(|| {
                format!(
                    "nested deeper than {limit} levels (line {}), the most accepted",
                    number + 1
                )
            })
        };
        if let Some(problem) = too_deep(base + flow) {
            return Some(problem);
        }
        // Whether the next character starts a node (line start, after `:`, `-`, `,`, `[`,
        // `{`, `?` and spaces).
        let mut node_start = true;
        let mut previous = b' ';
        let mut i = 0;
        while i < rest.len() {
            let c = rest[i];
            if let Some(q) = quote {
                if c == b'\\' && q == b'"' {
                    i += 2;
                    continue;
                }
                if c == q {
                    if q == b'\'' && rest.get(i + 1) == Some(&b'\'') {
                        i += 2;
                        continue;
                    }
                    quote = None;
                    node_start = false;
                }
                i += 1;
                continue;
            }
            match c {
                b'#' if previous == b' ' || previous == b'\t' => break,
                b'"' | b'\'' if node_start => quote = Some(c),
                b'[' | b'{' if node_start => {
                    flow += 1;
                    if let Some(problem) = too_deep(base + depth_here + flow) {
                        return Some(problem);
                    }
                }
                b']' | b'}' if flow > 0 => {
                    flow -= 1;
                    node_start = false;
                }
                b'-' if node_start
                    && flow == 0
                    && matches!(rest.get(i + 1), None | Some(b' ') | Some(b'\t')) =>
                {
                    // `- - x`: one more level per entry opened on this line.
                    depth_here += 1;
                    if let Some(problem) = too_deep(base + depth_here + flow) {
                        return Some(problem);
                    }
                }
                b'|' | b'>' if node_start && flow == 0 => {
                    // A block scalar: the more indented lines that follow are its content.
                    let tail = &rest[i + 1..];
                    let header_ends = tail
                        .iter()
                        .position(|b| *b == b'#')
                        .map_or(tail, |at| &tail[..at]);
                    if header_ends
                        .iter()
                        .all(|b| matches!(b, b'+' | b'-' | b'0'..=b'9' | b' ' | b'\t' | b'\r'))
                    {
                        block_scalar = Some(indent);
                        break;
                    }
                    node_start = false;
                }
                b' ' | b'\t' | b'\r' => {}
                b':' | b',' | b'?' => node_start = true,
                _ => node_start = false,
            }
            if c == b':' && flow == 0 {
                node_start = true;
            }
            previous = c;
            i += 1;
        }
    }
    None
}

#[cfg(test)]
mod input_file_tests {
    use super::*;

    #[test]
    fn input_files_over_the_limit_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let small = dir.path().join("small");
        std::fs::write(&small, "stateDir: /x\n").unwrap();
        assert_eq!(read_input_file(&small).unwrap(), b"stateDir: /x\n");
        let big = dir.path().join("big");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(MAX_INPUT_FILE + 1).unwrap();
        let e = read_input_file(&big).unwrap_err();
        assert_eq!(e.to_string(), "larger than 16 MiB, the most accepted");
    }

    #[test]
    fn deep_nesting_is_refused_in_one_pass() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("deep.yaml");
        // 50,000 flow levels: refused at the limit (the YAML scanner takes 17 s on it in a
        // debug build).
        std::fs::write(
            &deep,
            format!("a: {}{}\n", "[".repeat(50_000), "]".repeat(50_000)),
        )
        .unwrap();
        let refusal = |path: &std::path::Path| match read_input_file(path) {
            Ok(bytes) => panic!("{} bytes accepted", bytes.len()),
            Err(e) => e.to_string(),
        };
        assert_eq!(
            refusal(&deep),
            "nested deeper than 512 levels (line 1), the most accepted"
        );
        // Block nesting: one level per more indented line.
        let block: String = (0..600).map(|i| format!("{}k:\n", " ".repeat(i))).collect();
        std::fs::write(&deep, block).unwrap();
        assert_eq!(
            refusal(&deep),
            "nested deeper than 512 levels (line 513), the most accepted"
        );
        // Sequences opened on one line count too.
        let dashes = format!("{}x\n", "- ".repeat(600));
        assert!(nesting_problem(dashes.as_bytes(), 512).is_some());
    }

    #[test]
    fn what_is_not_nesting_is_not_counted() {
        // Brackets in plain scalars, quoted strings, comments and block scalars; apostrophes
        // inside plain scalars; closed flow collections: none accumulates.
        let mut text = String::new();
        for i in 0..1000 {
            text.push_str(&format!(
                "k{i}: a[b{{c # [[[ {{\nq{i}: \"[[{{\\\"\"\ns{i}: '[it''s'\np{i}: don't [\nf{i}: [1, [2, {{x: 3}}]]\n"
            ));
        }
        text.push_str("script: |\n  [[[[\n      {{{{\n  ]\nafter: 1\n");
        assert_eq!(nesting_problem(text.as_bytes(), 8), None);
        // Real nesting within the limit is accepted; one more level is not.
        let nested: String = (0..8).map(|i| format!("{}k:\n", " ".repeat(i))).collect();
        assert_eq!(nesting_problem(nested.as_bytes(), 8), None);
        let deeper: String = (0..9).map(|i| format!("{}k:\n", " ".repeat(i))).collect();
        assert!(nesting_problem(deeper.as_bytes(), 8).is_some());
        assert!(nesting_problem(b"a: [[[[[[[[[1]]]]]]]]]\n", 8).is_some());
        assert_eq!(nesting_problem(b"a: [[[[[[[1]]]]]]]\n", 8), None);
    }
}
