//! The example provider (work in progress, issue 8).
