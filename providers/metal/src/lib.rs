//! The `metal` provider (work in progress, issue 9).
