//! kube-lease-manager against the in-memory API server: acquire, renew, hand over.

mod support;

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube_apiserver_inmem::ApiServer;
use kube_lease_manager::LeaseManagerBuilder;
use support::wait_until;

#[tokio::test]
async fn lease_manager_acquires_renews_and_hands_over() {
    let server = ApiServer::start().await.unwrap();
    let ctl = server.controls();
    let leases: Api<Lease> = Api::namespaced(server.client(), "kube-system");
    let build = |id: &str| {
        LeaseManagerBuilder::new(server.client(), "ccm-leader")
            .with_namespace("kube-system")
            .with_identity(id)
            .with_duration(3)
            .with_grace(1)
            .build()
    };
    let m1 = build("a").await.unwrap();
    let (rx1, task1) = m1.watch().await;
    assert!(
        wait_until(Duration::from_secs(10), || async { *rx1.borrow() }).await,
        "first manager acquires"
    );
    let m2 = build("b").await.unwrap();
    let (rx2, task2) = m2.watch().await;

    let holder = |l: &Lease| l.spec.as_ref().and_then(|s| s.holder_identity.clone());
    let renew = |l: &Lease| l.spec.as_ref().and_then(|s| s.renew_time.clone());
    let first = leases.get("ccm-leader").await.unwrap();
    assert_eq!(holder(&first).as_deref(), Some("a"));
    // Longer than the lease duration: the holder must renew and the other must not take over.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let later = leases.get("ccm-leader").await.unwrap();
    assert_eq!(holder(&later).as_deref(), Some("a"));
    assert_ne!(renew(&first), renew(&later), "the lease was renewed");
    assert!(*rx1.borrow() && !*rx2.borrow());

    // Hand over: the first manager stops and releases; the second takes the lease.
    drop(rx1);
    let m1 = task1.await.unwrap().unwrap();
    m1.release().await.unwrap();
    assert!(
        wait_until(Duration::from_secs(15), || async { *rx2.borrow() }).await,
        "second manager takes over"
    );
    let last = leases.get("ccm-leader").await.unwrap();
    assert_eq!(holder(&last).as_deref(), Some("b"));
    let transitions = last
        .spec
        .as_ref()
        .and_then(|s| s.lease_transitions)
        .unwrap_or(0);
    assert!(transitions >= 1, "leaseTransitions counted: {transitions}");

    // The writes used server-side apply and strategic merge patches.
    let types: Vec<String> = ctl
        .requests()
        .into_iter()
        .filter(|r| r.verb == "patch" && r.resource == "leases.coordination.k8s.io")
        .map(|r| r.content_type)
        .collect();
    assert!(
        types
            .iter()
            .any(|t| t.starts_with("application/apply-patch+yaml")),
        "{types:?}"
    );
    assert!(
        types
            .iter()
            .any(|t| t.starts_with("application/strategic-merge-patch+json")),
        "{types:?}"
    );
    drop(rx2);
    let _ = task2.await;
    server.shutdown().await;
}
