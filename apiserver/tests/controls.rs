//! Test controls of the in-memory API server: request log, write counts, fault injection,
//! content negotiation, discovery and kubeconfig.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube_apiserver_inmem::ApiServer;
use serde_json::json;
use support::{api_code, api_reason, obj};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn node_api(server: &ApiServer) -> Api<Node> {
    let nodes: Api<Node> = Api::all(server.client());
    nodes
        .create(
            &PostParams::default(),
            &obj(json!({"metadata": {"name": "n1"}})),
        )
        .await
        .unwrap();
    nodes
}

/// A raw HTTP/1.1 request; returns (status code, body).
async fn raw(
    server: &ApiServer,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let code = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (code, body)
}

#[tokio::test]
async fn request_log_and_write_counts() {
    let server = ApiServer::start().await.unwrap();
    let ctl = server.controls();
    let nodes = node_api(&server).await;
    ctl.clear_requests();
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap();
    nodes.get("n1").await.unwrap();
    let log = ctl.requests();
    assert_eq!(log.len(), 2, "{log:?}");
    assert_eq!(log[0].verb, "patch");
    assert_eq!(log[0].path, "/api/v1/nodes/n1");
    assert_eq!(
        log[0].content_type,
        "application/strategic-merge-patch+json"
    );
    assert_eq!(log[0].json(), json!({"metadata": {"labels": {"a": "b"}}}));
    assert_eq!(log[0].code, 200);
    assert_eq!((log[1].verb.as_str(), log[1].name.as_str()), ("get", "n1"));
    // create + patch; the GET and a no-op patch do not count.
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap();
    assert_eq!(ctl.writes_to("nodes", "", "n1"), 2);
    assert_eq!(ctl.writes_to("nodes", "", "other"), 0);
    let state = ctl.get("nodes", "", "n1").unwrap();
    assert_eq!(state["metadata"]["labels"], json!({"a": "b"}));
    server.shutdown().await;
}

#[tokio::test]
async fn injected_500_fails_exactly_n_requests() {
    let server = ApiServer::start().await.unwrap();
    let ctl = server.controls();
    let nodes = node_api(&server).await;
    ctl.fail_next(2, "get", "nodes", 500);
    for _ in 0..2 {
        let e = nodes.get("n1").await.unwrap_err();
        assert_eq!(api_code(&e), Some(500));
        assert_eq!(api_reason(&e), "InternalError");
    }
    nodes.get("n1").await.expect("third get succeeds");
    // Other verbs were never affected.
    ctl.fail_next(1, "list", "services", 500);
    nodes.get("n1").await.expect("unrelated request succeeds");
    server.shutdown().await;
}

#[tokio::test]
async fn injected_429_carries_retry_after_and_kube_retries() {
    let server = ApiServer::start().await.unwrap();
    let ctl = server.controls();
    let nodes = node_api(&server).await;
    ctl.fail_next(1, "get", "nodes", 429);
    let (code, body) = raw(&server, "GET", "/api/v1/nodes/n1", &[], "").await;
    assert_eq!(code, 429);
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status["reason"], "TooManyRequests");
    assert_eq!(status["details"]["retryAfterSeconds"], 1);

    // kube::Client retries 429 after Retry-After (1 s each).
    ctl.clear_requests();
    ctl.fail_next(2, "get", "nodes", 429);
    let start = Instant::now();
    nodes.get("n1").await.expect("get succeeds after retries");
    assert!(
        start.elapsed() >= Duration::from_millis(1900),
        "waited {:?}",
        start.elapsed()
    );
    let codes: Vec<u16> = ctl.requests().iter().map(|r| r.code).collect();
    assert_eq!(codes, [429, 429, 200]);
    server.shutdown().await;
}

#[tokio::test]
async fn latency_and_forced_conflicts() {
    let server = ApiServer::start().await.unwrap();
    let ctl = server.controls();
    let nodes = node_api(&server).await;
    ctl.set_latency(Duration::from_millis(300));
    let start = Instant::now();
    nodes.get("n1").await.unwrap();
    assert!(start.elapsed() >= Duration::from_millis(300));
    ctl.set_latency(Duration::ZERO);

    ctl.force_conflicts(1, "nodes");
    let pp = PatchParams::default();
    let e = nodes
        .patch(
            "n1",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}})),
        )
        .await
        .unwrap_err();
    assert_eq!(
        (api_code(&e), api_reason(&e).as_str()),
        (Some(409), "Conflict")
    );
    assert_eq!(
        ctl.writes_to("nodes", "", "n1"),
        1,
        "the conflicting patch wrote nothing"
    );
    nodes
        .patch(
            "n1",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}})),
        )
        .await
        .expect("next patch succeeds");
    server.shutdown().await;
}

#[tokio::test]
async fn content_negotiation_and_unsupported_patches() {
    let server = ApiServer::start().await.unwrap();
    let _ = node_api(&server).await;
    let (code, _) = raw(
        &server,
        "GET",
        "/api/v1/nodes",
        &[("Accept", "application/vnd.kubernetes.protobuf")],
        "",
    )
    .await;
    assert_eq!(code, 406);
    let (code, body) = raw(
        &server,
        "GET",
        "/api/v1/nodes",
        &[("Accept", "application/json, */*")],
        "",
    )
    .await;
    assert_eq!(code, 200);
    assert!(body.contains("\"kind\":\"NodeList\""));
    let (code, body) = raw(
        &server,
        "PATCH",
        "/api/v1/nodes/n1",
        &[("Content-Type", "application/xml")],
        "<x/>",
    )
    .await;
    assert_eq!(code, 415, "{body}");
    // A directive inside a list without a merge strategy is rejected, not guessed.
    let (code, body) = raw(
        &server,
        "PATCH",
        "/api/v1/nodes/n1",
        &[("Content-Type", "application/strategic-merge-patch+json")],
        r#"{"spec":{"taints":[{"key":"a","$patch":"delete"}]}}"#,
    )
    .await;
    assert_eq!(code, 422, "{body}");
    let (code, _) = raw(&server, "GET", "/api/v1/widgets", &[], "").await;
    assert_eq!(code, 404);
    let (code, _) = raw(&server, "GET", "/api/v1/namespaces/default/nodes", &[], "").await;
    assert_eq!(code, 404, "cluster-scoped resource under a namespace");
    let (code, _) = raw(
        &server,
        "GET",
        "/api/v1/nodes?fieldSelector=spec.bogus%3Dx",
        &[],
        "",
    )
    .await;
    assert_eq!(code, 400);
    server.shutdown().await;
}

#[tokio::test]
async fn discovery_and_kubeconfig() {
    let server = ApiServer::start().await.unwrap();
    let discovery = kube::discovery::Discovery::new(server.client())
        .run()
        .await
        .unwrap();
    let mut kinds: Vec<String> = discovery
        .groups()
        .flat_map(|g| {
            g.recommended_resources()
                .into_iter()
                .map(|(ar, _)| format!("{}/{}", ar.api_version, ar.kind))
        })
        .collect();
    kinds.sort();
    for want in [
        "v1/Node",
        "v1/Service",
        "coordination.k8s.io/v1/Lease",
        "events.k8s.io/v1/Event",
        "v1/ConfigMap",
    ] {
        assert!(
            kinds.iter().any(|k| k == want),
            "{want} missing from {kinds:?}"
        );
    }
    let info = server.client().apiserver_version().await.unwrap();
    assert_eq!(info.major, "1");

    let client = support::client_from_written_kubeconfig(&server).await;
    let names = support::namespace_names(client).await;
    assert_eq!(
        names,
        ["default", "kube-node-lease", "kube-public", "kube-system"]
    );
    server.shutdown().await;
}

/// TokenReview and SubjectAccessReview through kube's typed API, answered from the policy the
/// controls set; logged and faulted as creates.
#[tokio::test]
async fn token_and_subject_access_reviews_follow_the_policy() {
    use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
    use k8s_openapi::api::authorization::v1::{
        NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    };
    let server = ApiServer::start().await.unwrap();
    let ctl = server.controls();
    let tokens: Api<TokenReview> = Api::all(server.client());
    let reviews: Api<SubjectAccessReview> = Api::all(server.client());
    let token_review = |token: &str| TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let access = |user: &str, groups: Vec<String>, path: &str| SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.into()),
            groups: Some(groups),
            non_resource_attributes: Some(NonResourceAttributes {
                path: Some(path.into()),
                verb: Some("get".into()),
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let pp = PostParams::default();

    // Nothing registered: every token is refused, every path denied.
    let status = tokens
        .create(&pp, &token_review("s3cret"))
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(status.authenticated, Some(false));
    let denied = reviews
        .create(&pp, &access("prometheus", vec![], "/metrics"))
        .await
        .unwrap();
    assert!(!denied.status.unwrap().allowed);

    ctl.add_token("s3cret", "prometheus", &["monitoring"]);
    ctl.allow_non_resource("monitoring", &["get"], &["/metrics"]);
    let status = tokens
        .create(&pp, &token_review("s3cret"))
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(status.authenticated, Some(true));
    let user = status.user.unwrap();
    assert_eq!(user.username.as_deref(), Some("prometheus"));
    let groups = user.groups.unwrap();
    assert_eq!(groups, ["monitoring", "system:authenticated"]);
    let allowed = reviews
        .create(&pp, &access("prometheus", groups.clone(), "/metrics"))
        .await
        .unwrap();
    assert!(allowed.status.unwrap().allowed);
    let other_path = reviews
        .create(&pp, &access("prometheus", groups, "/configz"))
        .await
        .unwrap();
    assert!(!other_path.status.unwrap().allowed);
    let masters = reviews
        .create(&pp, &access("admin", vec!["system:masters".into()], "/x"))
        .await
        .unwrap();
    assert!(masters.status.unwrap().allowed);

    ctl.remove_token("s3cret");
    let status = tokens
        .create(&pp, &token_review("s3cret"))
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(status.authenticated, Some(false));

    // Logged as creates; faults apply; an empty token is invalid; other verbs are 405.
    let log = ctl.requests();
    assert!(log.iter().any(|r| r.verb == "create"
        && r.resource == "tokenreviews.authentication.k8s.io"
        && r.code == 201));
    assert_eq!(
        log.iter()
            .filter(|r| r.resource == "subjectaccessreviews.authorization.k8s.io")
            .count(),
        4
    );
    ctl.fail_next(1, "create", "tokenreviews.authentication.k8s.io", 500);
    let err = tokens.create(&pp, &token_review("x")).await.unwrap_err();
    assert_eq!(api_code(&err), Some(500));
    let err = tokens.create(&pp, &token_review("")).await.unwrap_err();
    assert_eq!(api_code(&err), Some(422));
    let (code, _) = raw(
        &server,
        "GET",
        "/apis/authentication.k8s.io/v1/tokenreviews",
        &[],
        "",
    )
    .await;
    assert_eq!(code, 405);
}
