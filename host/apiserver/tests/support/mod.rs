//! Helpers shared by the test files of this crate (each test binary uses some of them).
#![allow(dead_code)]

use std::time::{Duration, Instant};

use serde_json::Value;

/// Build a typed object from JSON (panics on a malformed literal in a test).
pub fn obj<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("test object literal must decode")
}

/// Poll `f` until it returns true or `timeout` passes.
pub async fn wait_until<F, Fut>(timeout: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if f().await {
            return true;
        }
        if start.elapsed() > timeout {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The HTTP code of a kube error, if it is an API error.
pub fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// The `Status.reason` of a kube error.
pub fn api_reason(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.reason.clone(),
        other => format!("not an API error: {other}"),
    }
}
