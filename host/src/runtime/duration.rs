//! Go-style durations (`5m`, `10s`, `1h30m`, `250ms`) as upstream flags and messages use them.

use std::time::Duration;

/// Parse a Go duration string: a sequence of decimal numbers with units `ns`, `us`/`µs`, `ms`,
/// `s`, `m`, `h`; a bare `0` is allowed. Negative durations are rejected (no flag takes one).
pub fn parse(input: &str) -> Result<Duration, String> {
    let s = input.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err("empty duration".into());
    }
    if s.starts_with('-') {
        return Err(format!("invalid duration {input:?}: must not be negative"));
    }
    let s = s.strip_prefix('+').unwrap_or(s);
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return Err(format!("invalid duration {input:?}: expected a number"));
        }
        let value: f64 = rest[..num_len].parse().map_err(|_| {
            format!(
                "invalid duration {input:?}: bad number {:?}",
                &rest[..num_len]
            )
        })?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        let nanos_per = match unit {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            "" => {
                return Err(format!(
                    "invalid duration {input:?}: missing unit (use e.g. 10s, 5m)"
                ))
            }
            other => {
                return Err(format!(
                    "invalid duration {input:?}: unknown unit {other:?}"
                ))
            }
        };
        total += value * nanos_per;
        rest = &rest[unit_len..];
    }
    if !total.is_finite() || total > u64::MAX as f64 {
        return Err(format!("invalid duration {input:?}: too large"));
    }
    Ok(Duration::from_nanos(total.round() as u64))
}

/// Format like Go's `time.Duration.String()` (`1.5s`, `250ms`, `1m2s`, `1h0m0s`).
pub fn format(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".into();
    }
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return trim_float(nanos as f64 / 1e3, "µs");
    }
    if nanos < 1_000_000_000 {
        return trim_float(nanos as f64 / 1e6, "ms");
    }
    let total_secs = d.as_secs();
    let hours = total_secs / 3600;
    let minutes = (total_secs % 3600) / 60;
    let seconds = (total_secs % 60) as f64 + f64::from(d.subsec_nanos()) / 1e9;
    let mut out = String::new();
    if hours > 0 {
        out.push_str(&format!("{hours}h"));
    }
    if hours > 0 || minutes > 0 {
        out.push_str(&format!("{minutes}m"));
    }
    out.push_str(&trim_float(seconds, "s"));
    out
}

fn trim_float(v: f64, unit: &str) -> String {
    let s = format!("{v:.9}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s}{unit}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        assert_eq!(parse("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse("0").unwrap(), Duration::ZERO);
        assert!(parse("10").unwrap_err().contains("missing unit"));
        assert!(parse("5x").unwrap_err().contains("unknown unit"));
        assert!(parse("-5s").unwrap_err().contains("negative"));
        assert!(parse("").is_err());
    }

    #[test]
    fn formats_like_go() {
        assert_eq!(format(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format(Duration::from_micros(2500)), "2.5ms");
        assert_eq!(format(Duration::from_nanos(800)), "800ns");
        assert_eq!(format(Duration::from_secs(62)), "1m2s");
        assert_eq!(format(Duration::from_secs(3600)), "1h0m0s");
        assert_eq!(format(Duration::ZERO), "0s");
    }
}
