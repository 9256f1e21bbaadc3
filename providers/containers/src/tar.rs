//! The two tar operations the Engine API's archive endpoints need: write an archive of one
//! directory holding files (to put the proxy's configuration into its container), and read the
//! first regular file of an archive (to read it back). ustar headers only; names are short.

/// A tar archive holding `dir/` (mode 0755) and `dir/<name>` for each file (mode 0644).
pub fn archive(dir: &str, files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&header(&format!("{dir}/"), 0, b'5', 0o755));
    for (name, data) in files {
        out.extend_from_slice(&header(&format!("{dir}/{name}"), data.len(), b'0', 0o644));
        out.extend_from_slice(data);
        let pad = (512 - data.len() % 512) % 512;
        out.extend(std::iter::repeat_n(0u8, pad));
    }
    out.extend(std::iter::repeat_n(0u8, 1024));
    out
}

fn octal(field: &mut [u8], value: u64) {
    let text = format!("{value:0width$o}\0", width = field.len() - 1);
    field.copy_from_slice(text.as_bytes());
}

fn header(name: &str, size: usize, kind: u8, mode: u64) -> [u8; 512] {
    assert!(name.len() < 100, "tar member name too long: {name}");
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    octal(&mut h[100..108], mode);
    octal(&mut h[108..116], 0);
    octal(&mut h[116..124], 0);
    octal(&mut h[124..136], size as u64);
    octal(&mut h[136..148], 0);
    h[156] = kind;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u64 = h.iter().map(|b| u64::from(*b)).sum();
    let text = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(text.as_bytes());
    h
}

fn parse_octal(field: &[u8]) -> Option<usize> {
    let text: String = field
        .iter()
        .take_while(|b| **b != 0)
        .map(|b| *b as char)
        .collect();
    let text = text.trim();
    if text.is_empty() {
        return Some(0);
    }
    usize::from_str_radix(text, 8).ok()
}

/// The content of the first regular file in `tar` (`None` if there is none or the archive is
/// malformed).
pub fn first_file(tar: &[u8]) -> Option<Vec<u8>> {
    let mut at = 0;
    while at + 512 <= tar.len() {
        let h = &tar[at..at + 512];
        if h.iter().all(|b| *b == 0) {
            return None;
        }
        let size = parse_octal(&h[124..136])?;
        let kind = h[156];
        let start = at + 512;
        if kind == b'0' || kind == 0 {
            return tar.get(start..start + size).map(<[u8]>::to_vec);
        }
        at = start + size.div_ceil(512) * 512;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_archive_reads_back() {
        let data = b"global\n  maxconn 100\n".repeat(40);
        let tar = archive("ccm-lb", &[("haproxy.cfg", &data)]);
        assert_eq!(tar.len() % 512, 0);
        assert_eq!(first_file(&tar).unwrap(), data);
        assert_eq!(&tar[..7], b"ccm-lb/");
        assert_eq!(first_file(&[0u8; 1024]), None);
        assert_eq!(first_file(&archive("d", &[])), None);
    }
}
