//! Calls that did not return within the call deadline, and what the suite does about them.
//!
//! The host never waits for a plugin call past its deadline, but a provider method that hangs
//! (or is slower than `--provider-call-timeout`) would still cost one deadline per call: per
//! node, per probe, per cleanup step. So the suite remembers every method that ran into the
//! deadline and never calls it again: the check where it happened fails once, naming the call,
//! and a later check that needs the method is skipped ("depends on InstanceShutdown, which did
//! not return within 30s in instance-shutdown"). Calls the controllers make are seen through
//! the call metrics; a wait for a controller ends as soon as one of its calls times out.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Mutex;

use ccm_provider_abi::{ErrorKind, ProviderError};

use super::Suite;

/// A provider method that ran into the call deadline.
#[derive(Debug, Clone)]
pub(crate) struct Hang {
    /// The method (`InstanceShutdown`).
    pub method: String,
    /// The check during which it happened (or `cleanup`).
    pub check: &'static str,
    /// The call, for people: `InstanceShutdown(ccm-check-1)`, or the method and its callers.
    pub call: String,
}

#[derive(Default)]
pub(crate) struct HangState {
    /// Every method that ran into the deadline, in order.
    hangs: Vec<Hang>,
    /// Timeouts per method already accounted for (from the call metrics).
    noted: BTreeMap<String, u64>,
    /// Timeouts of calls the suite did not wait for (controllers in the background), per
    /// method, for the `deadline` check's summary.
    background: BTreeMap<String, u64>,
    /// The check running now.
    check: &'static str,
    /// An earlier hang the running check needed (a call it did not make): its index.
    needed: Option<usize>,
}

/// The hang bookkeeping of a suite (behind a lock: checks call the provider through `&Suite`).
#[derive(Default)]
pub(crate) struct Hangs(Mutex<HangState>);

impl Hangs {
    fn lock(&self) -> std::sync::MutexGuard<'_, HangState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// `ccm_provider_call_timeouts_total` per method in a metrics text, and the callers of each
/// method (from `ccm_provider_calls_total`).
fn callers(text: &str, method: &str) -> Vec<String> {
    let mut out: Vec<String> = text
        .lines()
        .filter(|l| l.starts_with("ccm_provider_calls_total{"))
        .filter(|l| l.contains(&format!("method=\"{method}\"")))
        .filter_map(|l| {
            let start = l.find("caller=\"")? + "caller=\"".len();
            let end = start + l[start..].find('"')?;
            Some(l[start..end].to_string())
        })
        .filter(|c| c != ccm_host::provider::HOST_CALLER)
        .collect();
    out.sort();
    out.dedup();
    out
}

impl Suite {
    fn deadline_text(&self) -> String {
        ccm_host::runtime::duration::format(self.plan.call_timeout)
    }

    /// The hang of `method`, if it ran into the deadline earlier.
    pub(crate) fn hang_of(&self, method: &str) -> Option<Hang> {
        self.hangs
            .lock()
            .hangs
            .iter()
            .find(|h| h.method == method)
            .cloned()
    }

    /// A check starts: timeouts seen since the last one were background calls.
    pub(crate) fn begin_check(&self, id: &'static str) {
        self.absorb_timeouts(true);
        let mut s = self.hangs.lock();
        s.check = id;
        s.needed = None;
    }

    /// A check ended with `outcome`: a call that hung during it makes it fail with that call
    /// (whatever else it found follows from it); a method that hung earlier, which it needed,
    /// makes it a skip.
    pub(crate) fn end_check(&self, id: &'static str, outcome: super::Outcome) -> super::Outcome {
        let (own, needed) = {
            let s = self.hangs.lock();
            let own: Vec<Hang> = s.hangs.iter().filter(|h| h.check == id).cloned().collect();
            (own, s.needed.map(|i| s.hangs[i].clone()))
        };
        if !own.is_empty() {
            let deadline = self.deadline_text();
            let calls: Vec<String> = own.iter().map(|h| h.call.clone()).collect();
            let methods: Vec<&str> = own.iter().map(|h| h.method.as_str()).collect();
            return super::Outcome::fail(format!(
                "{} did not return within {deadline} (--provider-call-timeout): the provider hangs there or is too slow; {} not called again, checks that need {} are skipped",
                calls.join(" and "),
                methods.join(", "),
                if methods.len() == 1 { "it" } else { "them" }
            ));
        }
        if let Some(hang) = needed {
            return super::Outcome::skip(format!(
                "skipped: depends on {}, which did not return within {} in {}",
                hang.method,
                self.deadline_text(),
                hang.check
            ));
        }
        outcome
    }

    /// The check that an earlier hang the running check needed happened in (for the
    /// dependency bookkeeping of [`super::Suite::gate`]).
    pub(crate) fn needed_hang_check(&self) -> Option<&'static str> {
        let s = self.hangs.lock();
        s.needed.map(|i| s.hangs[i].check)
    }

    /// Whether the running check met a hang (its own, or an earlier one it needed): its waits
    /// and polls end at once.
    pub(crate) fn stalled(&self) -> bool {
        let s = self.hangs.lock();
        s.needed.is_some() || s.hangs.iter().any(|h| h.check == s.check)
    }

    /// Record `method` as hung during the running check.
    fn record_hang(s: &mut HangState, method: &str, call: String) {
        if s.hangs.iter().any(|h| h.method == method) {
            return;
        }
        let check = s.check;
        s.hangs.push(Hang {
            method: method.to_string(),
            check,
            call,
        });
    }

    /// Timeouts the metrics show that were not accounted for yet, per method.
    fn unnoted_timeouts(&self, s: &HangState) -> BTreeMap<String, u64> {
        self.counter_by_method("ccm_provider_call_timeouts_total")
            .into_iter()
            .filter_map(|(m, n)| {
                let before = s.noted.get(&m).copied().unwrap_or(0);
                (n > before).then(|| (m, n - before))
            })
            .collect()
    }

    /// Account for every timeout so far without recording a hang: `background` counts them
    /// as calls nobody waited for (the `deadline` check reports them), else they are the
    /// deadline probe's own expired calls.
    pub(crate) fn absorb_timeouts(&self, background: bool) {
        let mut s = self.hangs.lock();
        let new = self.unnoted_timeouts(&s);
        for (method, n) in new {
            *s.noted.entry(method.clone()).or_insert(0) += n;
            if background && !s.hangs.iter().any(|h| h.method == method) {
                *s.background.entry(method).or_insert(0) += n;
            }
        }
    }

    /// Timeouts of background calls (methods not reported as hung), per method.
    pub(crate) fn background_timeouts(&self) -> BTreeMap<String, u64> {
        self.absorb_timeouts(true);
        let s = self.hangs.lock();
        s.background
            .iter()
            .filter(|(m, _)| !s.hangs.iter().any(|h| &h.method == *m))
            .map(|(m, n)| (m.clone(), *n))
            .collect()
    }

    /// While waiting for a controller: a call of a method not known to hang ran into the
    /// deadline. It is recorded as a hang of the running check (the wait ends with it).
    pub(crate) fn controller_call_hung(&self) -> bool {
        let text = self.metrics_text();
        let mut s = self.hangs.lock();
        let new = self.unnoted_timeouts(&s);
        let mut hung = false;
        for (method, n) in new {
            *s.noted.entry(method.clone()).or_insert(0) += n;
            if s.hangs.iter().any(|h| h.method == method) {
                continue;
            }
            let by = callers(&text, &method);
            let call = if by.is_empty() {
                method.clone()
            } else {
                format!("{method} (called by {})", by.join(", "))
            };
            Self::record_hang(&mut s, &method, call);
            hung = true;
        }
        hung
    }

    /// A direct provider call of the suite: not made when `method` hung before (the running
    /// check then becomes a skip), and recorded as a hang when it runs into the deadline.
    /// `what` names the object of the call (a node, a Service), for the report.
    pub(crate) async fn direct<T>(
        &self,
        method: &'static str,
        what: &str,
        call: impl Future<Output = Result<T, ProviderError>>,
    ) -> Result<T, ProviderError> {
        if let Some(hang) = self.hang_of(method) {
            let mut s = self.hangs.lock();
            if s.needed.is_none() && hang.check != s.check {
                s.needed = s.hangs.iter().position(|h| h.method == method);
            }
            return Err(ProviderError::deadline_exceeded(format!(
                "{method} was not called: it did not return within {} in {}",
                self.deadline_text(),
                hang.check
            )));
        }
        let result = self.seen(call.await);
        if let Err(e) = &result {
            if e.kind() == ErrorKind::DEADLINE_EXCEEDED {
                let label = if what.is_empty() {
                    method.to_string()
                } else {
                    format!("{method}({what})")
                };
                let mut s = self.hangs.lock();
                let new = self.unnoted_timeouts(&s);
                for (m, n) in &new {
                    *s.noted.entry(m.clone()).or_insert(0) += n;
                }
                // The method itself, or what the call made of it (a helper that calls
                // another method first).
                if new.is_empty() || new.contains_key(method) {
                    Self::record_hang(&mut s, method, label.clone());
                }
                for m in new.keys().filter(|m| m.as_str() != method) {
                    Self::record_hang(&mut s, m, format!("{m} (for {label})"));
                }
            }
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn callers_of_a_method_from_the_call_counter() {
        let text = "ccm_provider_calls_total{method=\"InstanceMetadata\",caller=\"cloud-node-controller\"} 3\n\
            ccm_provider_calls_total{method=\"InstanceMetadata\",caller=\"host\"} 1\n\
            ccm_provider_calls_total{method=\"InstanceExists\",caller=\"cloud-node-lifecycle-controller\"} 1\n";
        assert_eq!(callers(text, "InstanceMetadata"), ["cloud-node-controller"]);
        assert!(callers(text, "ListRoutes").is_empty());
    }
}
