//! What the host offers a provider at `Initialize` (the equivalent of upstream's client
//! builder and stop channel).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RResult, RSlice, RStr, RString};
use ccm_provider_abi::abi::{AbiHost, AbiKubeResponse, AbiResult, HostBox};
use ccm_provider_abi::{CallContext, ProviderError};

/// Host services for the provider: cluster name, Kubernetes API access, stop signal.
#[derive(Clone)]
pub struct HostServices {
    cluster_name: String,
    client: Option<kube::Client>,
    runtime: Option<tokio::runtime::Handle>,
    stopping: Arc<AtomicBool>,
}

impl HostServices {
    /// Services backed by `client` (requests run on the current tokio runtime).
    pub fn new(
        cluster_name: &str,
        client: Option<kube::Client>,
        stopping: Arc<AtomicBool>,
    ) -> Self {
        Self {
            cluster_name: cluster_name.to_string(),
            client,
            runtime: tokio::runtime::Handle::try_current().ok(),
            stopping,
        }
    }

    pub(crate) fn into_abi(self) -> HostBox {
        HostBox::from_value(self, TD_Opaque)
    }
}

impl AbiHost for HostServices {
    fn cluster_name(&self) -> RString {
        self.cluster_name.as_str().into()
    }

    fn kube_request(
        &self,
        ctx: &CallContext,
        method: RStr<'_>,
        path: RStr<'_>,
        content_type: RStr<'_>,
        body: RSlice<'_, u8>,
    ) -> AbiResult<AbiKubeResponse> {
        let (Some(client), Some(runtime)) = (self.client.clone(), self.runtime.clone()) else {
            return RResult::RErr(
                ProviderError::not_implemented().context("no Kubernetes client in this host"),
            );
        };
        if let Err(e) = ctx.check() {
            return RResult::RErr(e);
        }
        let mut builder = http::Request::builder()
            .method(method.as_str())
            .uri(path.as_str());
        if !body.is_empty() {
            let ct = if content_type.is_empty() {
                "application/json"
            } else {
                content_type.as_str()
            };
            builder = builder.header(http::header::CONTENT_TYPE, ct);
        }
        let request = match builder.body(body.to_vec()) {
            Ok(r) => r,
            Err(e) => return RResult::RErr(ProviderError::other(format!("invalid request: {e}"))),
        };
        // Provider calls run on the provider's call pool, never on a runtime worker, so blocking on
        // the host's runtime here is allowed.
        let timeout = ctx
            .remaining()
            .unwrap_or(std::time::Duration::from_secs(30));
        let outcome = runtime.block_on(async move {
            tokio::time::timeout(timeout, client.request_text(request)).await
        });
        match outcome {
            Err(_) => RResult::RErr(ProviderError::deadline_exceeded(
                "Kubernetes API request timed out",
            )),
            Ok(Ok(text)) => RResult::ROk(AbiKubeResponse {
                status: 200,
                body: text.into_bytes().into(),
            }),
            Ok(Err(kube::Error::Api(status))) => RResult::ROk(AbiKubeResponse {
                status: status.code,
                body: serde_json::to_vec(&status).unwrap_or_default().into(),
            }),
            Ok(Err(e)) => RResult::RErr(ProviderError::other(format!(
                "Kubernetes API request failed: {e}"
            ))),
        }
    }

    fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }
}
