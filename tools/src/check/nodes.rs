//! Node checks: initialisation by the real cloud-node controller, provider IDs, addresses,
//! zones, existence and shutdown semantics, the ABI 1.1 bulk lookup against the per-node
//! methods, and one pass of the real lifecycle controller.

use std::collections::BTreeMap;
use std::sync::Arc;

use ccm_provider_abi::ext::InstanceQuery;
use ccm_provider_abi::{ErrorKind, InstanceMetadata, InstanceStatus, ProviderError};
use k8s_openapi::api::core::v1::Node;
use kube::api::DeleteParams;
use kube::Api;

use super::report::Outcome;
use super::scene::{self, NodeSpec};
use super::{err_text, per_node, step, validate, Suite};
use ccm_host::controllers::node;
use ccm_host::controllers::node_lifecycle;
use ccm_host::runtime::well_known::{
    REGION_BETA_LABEL, REGION_LABEL, SHUTDOWN_TAINT, UNINITIALIZED_TAINT, ZONE_BETA_LABEL,
    ZONE_LABEL,
};
use ccm_host::runtime::CachedNode;

/// `1 node`, `2 nodes`.
pub(super) fn count(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

fn has_taint(node: &Node, key: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == key))
}

fn provider_id_of(node: &Node) -> &str {
    node.spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .unwrap_or_default()
}

fn label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(key))
        .map(String::as_str)
}

/// The provider ID an answer gives the node, as the node controller takes it: the node's own
/// when the metadata has none.
fn normalised_provider_id(md: &InstanceMetadata, node: &Node) -> String {
    if md.provider_id.is_empty() {
        provider_id_of(node).to_string()
    } else {
        md.provider_id.clone()
    }
}

impl Suite {
    /// The scene's nodes that get initialised: the check nodes and the stopped one.
    fn scene_nodes(&self) -> Vec<NodeSpec> {
        self.plan
            .nodes
            .iter()
            .chain(self.plan.shutdown_node.iter())
            .cloned()
            .collect()
    }

    /// Seed the scene's nodes as kubelet registers them: tainted, not Ready yet.
    pub(super) fn seed_nodes(&self) -> anyhow::Result<()> {
        for spec in self.scene_nodes() {
            self.server
                .controls()
                .seed(scene::node(&spec, "Unknown", true))?;
        }
        Ok(())
    }

    fn no_instances(&self) -> Option<String> {
        (!self.caps.instances && !self.caps.instances_v2)
            .then(|| "skipped (no Instances or InstancesV2)".to_string())
    }

    fn none_initialised(&self) -> Option<String> {
        self.no_instances().or_else(|| {
            self.initialised
                .is_empty()
                .then(|| "skipped (no node was initialised)".to_string())
        })
    }

    pub(super) async fn node_checks(&mut self) {
        step!(
            self,
            "node-init",
            self.no_instances(),
            self.node_init().await
        );
        step!(
            self,
            "provider-id",
            self.none_initialised(),
            self.provider_id_format()
        );
        step!(
            self,
            "provider-id-stable",
            self.none_initialised(),
            self.provider_id_stable().await
        );
        step!(
            self,
            "node-addresses",
            self.none_initialised(),
            self.node_addresses()
        );
        step!(
            self,
            "zone-region",
            self.none_initialised(),
            self.zone_region().await
        );
        step!(
            self,
            "instance-exists",
            self.none_initialised(),
            self.instance_exists().await
        );
        step!(
            self,
            "instance-absent",
            self.no_instances(),
            self.instance_absent().await
        );
        step!(
            self,
            "instance-shutdown",
            self.none_initialised(),
            self.instance_shutdown().await
        );
        step!(
            self,
            "instances-batch",
            self.no_bulk(),
            self.instances_batch().await
        );
        step!(
            self,
            "node-lifecycle",
            self.no_instances(),
            self.node_lifecycle().await
        );
    }

    fn no_bulk(&self) -> Option<String> {
        self.none_initialised().or_else(|| {
            (!self.provider.bulk_instances()).then(|| {
                "skipped (no BULK_INSTANCES: the controllers ask node by node)".to_string()
            })
        })
    }

    /// Initialisations the node controller has finished (taint removed, then addresses
    /// written): the count of its initial-sync-delay histogram.
    fn initial_syncs(&self) -> u64 {
        self.metric_value("node_controller_initial_node_sync_delay_seconds_count")
    }

    /// Wait until every named node has lost the uninitialised taint and the controller has
    /// finished that many initialisations since `base` (so the addresses it writes right after
    /// the taint are there too); returns the nodes that did and the names that did not.
    async fn wait_initialised(
        &self,
        names: &[String],
        base: u64,
    ) -> (BTreeMap<String, Node>, Vec<String>) {
        let done = |s: &Self| {
            names
                .iter()
                .filter_map(|n| s.stored_node(n))
                .filter(|n| !has_taint(n, UNINITIALIZED_TAINT))
                .map(|n| (n.metadata.name.clone().unwrap_or_default(), n))
                .collect::<BTreeMap<_, _>>()
        };
        let want = base + names.len() as u64;
        self.wait_for(|| {
            let all = done(self).len() == names.len() && self.initial_syncs() >= want;
            async move { all.then_some(()) }
        })
        .await;
        let initialised = done(self);
        let pending = names
            .iter()
            .filter(|n| !initialised.contains_key(*n))
            .cloned()
            .collect();
        (initialised, pending)
    }

    /// Why a node is still tainted: the controller's own steps, replayed.
    async fn why_not_initialised(&self, name: &str) -> String {
        let Some(node) = self.stored_node(name) else {
            return "the node disappeared".to_string();
        };
        if let Some(hang) = self.hang_of("InstanceMetadata") {
            return hang.call;
        }
        let md = match node::get_instance_metadata(&self.provider, &node).await {
            Err(e) => return e,
            Ok(None) => {
                return "InstanceMetadata returned no metadata (upstream's nil, nil), so the node stays tainted".to_string()
            }
            Ok(Some(md)) => md,
        };
        let mods = match node::node_modifications(&CachedNode::from(node.clone()), &md) {
            Err(e) => return e,
            Ok(m) => m,
        };
        for (key, value) in mods.labels.iter().chain(&mods.additional_labels) {
            if let Err(e) = validate::label_value(value) {
                return format!("label {key}: {e}; the API server refuses the node update");
            }
        }
        format!(
            "not initialised within {} although its metadata looks valid; see the log",
            ccm_host::runtime::duration::format(self.plan.sync_timeout)
        )
    }

    async fn node_init(&mut self) -> Outcome {
        let base = self.initial_syncs();
        self.start_controller(node::NAME, node::run);
        let names: Vec<String> = self.scene_nodes().into_iter().map(|n| n.name).collect();
        let (initialised, pending) = self.wait_initialised(&names, base).await;
        self.initialised = initialised;
        if pending.is_empty() {
            return Outcome::pass(format!(
                "{} initialised by {}",
                count(names.len(), "node"),
                node::NAME
            ));
        }
        if self.stalled() {
            // A call hung: the check fails with it (Suite::end_check).
            return Outcome::fail(format!("{} not initialised", count(pending.len(), "node")));
        }
        let mut reasons = Vec::new();
        for name in &pending {
            reasons.push((name.clone(), self.why_not_initialised(name).await));
        }
        let reasons = per_node(reasons);
        Outcome::fail(format!(
            "{} of {} nodes still tainted after {}: {}",
            pending.len(),
            names.len(),
            ccm_host::runtime::duration::format(self.plan.sync_timeout),
            reasons.join("; ")
        ))
    }

    fn provider_id_format(&self) -> Outcome {
        let scheme = self.provider.provider_name();
        let problems: Vec<String> = self
            .initialised
            .iter()
            .filter_map(|(name, n)| {
                validate::provider_id(scheme, provider_id_of(n))
                    .err()
                    .map(|e| format!("node {name}: {e}"))
            })
            .collect();
        let example = self
            .initialised
            .values()
            .next()
            .map(provider_id_of)
            .unwrap_or_default();
        Outcome::from_problems(
            problems,
            format!("{}, e.g. {example}", count(self.initialised.len(), "node")),
        )
    }

    /// The provider's own answer about a node's provider ID, as the controllers would get it.
    async fn provider_id_lookup(&self, node: &Node) -> Result<Option<String>, String> {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        if self.caps.instances_v2 {
            return match self
                .direct("InstanceMetadata", name, self.provider.instance_metadata(node))
                .await
            {
                Ok(Some(md)) => Ok(Some(md.provider_id)),
                Ok(None) => Err(format!(
                    "InstanceMetadata of initialised node {name} (by its providerID) returned no metadata"
                )),
                Err(e) => Err(format!(
                    "InstanceMetadata of initialised node {name} (by its providerID): {}",
                    err_text(&e)
                )),
            };
        }
        match self
            .direct(
                "InstanceID",
                name,
                node::get_instance_provider_id(&self.provider, name),
            )
            .await
        {
            Ok(id) => Ok(Some(id)),
            Err(e) if e.kind() == ErrorKind::NOT_IMPLEMENTED => Ok(None),
            Err(e) => Err(format!("InstanceID({name}): {}", err_text(&e))),
        }
    }

    async fn provider_id_stable(&mut self) -> Outcome {
        let mut problems = Vec::new();
        let first: BTreeMap<String, String> = self
            .initialised
            .iter()
            .map(|(k, n)| (k.clone(), provider_id_of(n).to_string()))
            .collect();
        // 1. Looked up again (by provider ID for V2): the same ID.
        for (name, node) in &self.initialised {
            match self.provider_id_lookup(node).await {
                Err(e) => problems.push(e),
                Ok(Some(id)) if !id.is_empty() && id != first[name] => problems.push(format!(
                    "node {name}: the provider now reports providerID {id:?}, the node has {:?}",
                    first[name]
                )),
                Ok(_) => {}
            }
        }
        // 2. The same nodes registered again (deleted, re-created by "kubelet") and initialised
        //    by the controller a second time: the same IDs.
        let specs: Vec<NodeSpec> = self
            .scene_nodes()
            .into_iter()
            .filter(|s| first.contains_key(&s.name))
            .collect();
        let api: Api<Node> = Api::all(self.client.clone());
        for spec in &specs {
            if let Err(e) = api.delete(&spec.name, &DeleteParams::default()).await {
                return Outcome::fail(format!("could not delete node {}: {e}", spec.name));
            }
        }
        let names: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
        // Wait for the informer to see the deletions, so the re-created nodes are new objects
        // to the controller too.
        let gone = self
            .wait_for(|| {
                let cached = names
                    .iter()
                    .any(|n| self.ctx.nodes.store().get(n).is_some());
                async move { (!cached).then_some(()) }
            })
            .await;
        if gone.is_none() {
            return Outcome::fail("the node cache did not see the nodes deleted");
        }
        let base = self.initial_syncs();
        for spec in &specs {
            if let Err(e) = self
                .server
                .controls()
                .seed(scene::node(spec, "Unknown", true))
            {
                return Outcome::fail(format!("could not re-create node {}: {e}", spec.name));
            }
        }
        let (again, pending) = self.wait_initialised(&names, base).await;
        if self.stalled() {
            return Outcome::fail("a call hung");
        }
        let mut reasons = Vec::new();
        for name in &pending {
            let why = self.why_not_initialised(name).await;
            reasons.push((
                name.clone(),
                format!("not initialised the second time: {why}"),
            ));
        }
        problems.extend(per_node(reasons));
        for (name, node) in &again {
            let id = provider_id_of(node);
            if id != first[name] {
                problems.push(format!(
                    "node {name}: providerID {:?} the first time, {id:?} the second",
                    first[name]
                ));
            }
        }
        self.initialised = again;
        Outcome::from_problems(
            problems,
            format!(
                "{}: same providerID when looked up again and when initialised twice",
                count(first.len(), "node")
            ),
        )
    }

    fn node_addresses(&self) -> Outcome {
        let mut problems = Vec::new();
        for (name, node) in &self.initialised {
            let addrs = node
                .status
                .as_ref()
                .and_then(|s| s.addresses.clone())
                .unwrap_or_default();
            for p in validate::node_addresses(&addrs) {
                problems.push(format!("node {name}: {p}"));
            }
        }
        let example = self
            .initialised
            .values()
            .next()
            .and_then(|n| n.status.as_ref()?.addresses.clone())
            .unwrap_or_default()
            .iter()
            .map(|a| format!("{}={}", a.type_, a.address))
            .collect::<Vec<_>>()
            .join(" ");
        Outcome::from_problems(
            problems,
            format!("{}, e.g. {example}", count(self.initialised.len(), "node")),
        )
    }

    /// Zone and region as the provider reports them for a node (the controller's source).
    async fn reported_zone(&self, node: &Node) -> Result<(String, String), String> {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        if self.caps.instances_v2 {
            return match self
                .direct(
                    "InstanceMetadata",
                    name,
                    self.provider.instance_metadata(node),
                )
                .await
            {
                Ok(Some(md)) => Ok((md.zone, md.region)),
                Ok(None) => Err(format!("InstanceMetadata({name}) returned no metadata")),
                Err(e) => Err(format!("InstanceMetadata({name}): {}", err_text(&e))),
            };
        }
        if !self.caps.zones {
            return Ok((String::new(), String::new()));
        }
        let by_id = self
            .direct(
                "GetZoneByProviderID",
                name,
                self.provider.get_zone_by_provider_id(provider_id_of(node)),
            )
            .await
            .map_err(|e| format!("GetZoneByProviderID({name}): {}", err_text(&e)));
        let by_name = self
            .direct(
                "GetZoneByNodeName",
                name,
                self.provider.get_zone_by_node_name(name),
            )
            .await
            .map_err(|e| format!("GetZoneByNodeName({name}): {}", err_text(&e)));
        match (by_id, by_name) {
            (Ok(a), Ok(b)) if a != b => Err(format!(
                "node {name}: GetZoneByProviderID says {}/{}, GetZoneByNodeName says {}/{}",
                a.failure_domain, a.region, b.failure_domain, b.region
            )),
            (Ok(z), _) | (Err(_), Ok(z)) => Ok((z.failure_domain, z.region)),
            (Err(a), Err(b)) => Err(format!("{a}; {b}")),
        }
    }

    async fn zone_region(&self) -> Outcome {
        let mut problems = Vec::new();
        let mut seen = Vec::new();
        for (name, node) in &self.initialised {
            for (ga, beta) in [
                (ZONE_LABEL, ZONE_BETA_LABEL),
                (REGION_LABEL, REGION_BETA_LABEL),
            ] {
                if let Some(v) = label(node, ga) {
                    if let Err(e) = validate::label_value(v) {
                        problems.push(format!("node {name}: {ga}: {e}"));
                    }
                    if v.is_empty() {
                        problems.push(format!("node {name}: {ga} is empty"));
                    }
                }
                if label(node, ga) != label(node, beta) {
                    problems.push(format!(
                        "node {name}: {ga}={:?} but {beta}={:?}",
                        label(node, ga),
                        label(node, beta)
                    ));
                }
            }
            match self.reported_zone(node).await {
                Err(e) => problems.push(e),
                Ok((zone, region)) => {
                    for (what, reported, key) in [
                        ("zone", &zone, ZONE_LABEL),
                        ("region", &region, REGION_LABEL),
                    ] {
                        let labelled = label(node, key).unwrap_or_default();
                        if !reported.is_empty() && labelled != reported.as_str() {
                            problems.push(format!(
                                "node {name}: the provider reports {what} {reported:?} but the node has {key}={labelled:?}"
                            ));
                        }
                    }
                    if !zone.is_empty() || !region.is_empty() {
                        seen.push(format!("{zone}/{region}"));
                    }
                }
            }
        }
        seen.sort();
        seen.dedup();
        let detail = if seen.is_empty() {
            "the provider reports no zone or region".to_string()
        } else {
            format!("zone/region {}", seen.join(", "))
        };
        Outcome::from_problems(problems, detail)
    }

    fn exists_method(&self) -> &'static str {
        if self.caps.instances_v2 {
            "InstanceExists"
        } else {
            "InstanceExistsByProviderID"
        }
    }

    fn shutdown_method(&self) -> &'static str {
        if self.caps.instances_v2 {
            "InstanceShutdown"
        } else {
            "InstanceShutdownByProviderID"
        }
    }

    async fn instance_exists(&self) -> Outcome {
        let method = self.exists_method();
        let mut problems = Vec::new();
        let mut errors = Vec::new();
        for (name, node) in &self.initialised {
            match self
                .direct(
                    method,
                    name,
                    node_lifecycle::ensure_node_exists(&self.provider, node),
                )
                .await
            {
                Ok(true) => {}
                Ok(false) => problems.push(format!(
                    "{method} says the instance of node {name} ({}) does not exist; the lifecycle controller would delete the Node (stopped instances must exist too)",
                    provider_id_of(node)
                )),
                Err(e) => errors.push((name.clone(), format!("{method}: {}", err_text(&e)))),
            }
        }
        problems.extend(per_node(errors));
        Outcome::from_problems(
            problems,
            format!(
                "{method} true for {}",
                count(self.initialised.len(), "node")
            ),
        )
    }

    fn absent_node(&self) -> Node {
        scene::typed_node(&scene::node(&self.absent, "Unknown", false))
    }

    async fn instance_absent(&self) -> Outcome {
        let method = self.exists_method();
        let node = self.absent_node();
        let id = provider_id_of(&node).to_string();
        match self
            .direct(
                method,
                &self.absent.name,
                node_lifecycle::ensure_node_exists(&self.provider, &node),
            )
            .await
        {
            Ok(false) => Outcome::pass(format!("{method} false for {id}")),
            Ok(true) => Outcome::fail(format!(
                "{method} says node {} with providerID {id:?} exists, but no instance has that ID; the lifecycle controller would never delete Nodes of deleted instances (if your cloud synthesises instances, as the fake provider's autoInstances does, use a cloud config without that, or pick an ID with --absent-provider-id)",
                self.absent.name
            )),
            Err(e) => Outcome::fail(format!(
                "{method} for the unknown providerID {id:?} returned {}; the contract is false without an error, otherwise the lifecycle controller never deletes the Node",
                err_text(&e)
            )),
        }
    }

    async fn instance_shutdown(&self) -> Outcome {
        let method = self.shutdown_method();
        let stopped = self.plan.shutdown_node.as_ref().map(|s| s.name.clone());
        let mut problems = Vec::new();
        let mut errors = Vec::new();
        let mut running = 0;
        for (name, node) in &self.initialised {
            let is_stopped = stopped.as_deref() == Some(name.as_str());
            match self
                .direct(
                    method,
                    name,
                    node_lifecycle::shutdown_in_cloud_provider(&self.provider, node),
                )
                .await
            {
                Ok(shut) if shut == is_stopped => {}
                Ok(true) => problems.push(format!(
                    "{method} says running node {name} is shut down (the check nodes must be running instances; use --shutdown-node for a stopped one)"
                )),
                Ok(false) => problems.push(format!(
                    "{method} says node {name}, whose instance is stopped (--shutdown-node), is not shut down"
                )),
                Err(e) => errors.push((name.clone(), format!("{method}: {}", err_text(&e)))),
            }
            if !is_stopped {
                running += 1;
            }
        }
        problems.extend(per_node(errors));
        let mut detail = format!("{method} false for {}", count(running, "running node"));
        match &stopped {
            Some(s) if self.initialised.contains_key(s) => {
                detail.push_str(&format!(", true for stopped node {s}"))
            }
            Some(s) => problems.push(format!(
                "stopped node {s} was not initialised, so its shutdown state was not checked"
            )),
            None => detail.push_str(" (no --shutdown-node given)"),
        }
        Outcome::from_problems(problems, detail)
    }

    /// What the per-node methods answer about `node` (the reference for the bulk lookup):
    /// existence, shutdown, metadata (upstream's `(nil, nil)` as `None`).
    async fn per_node_answers(
        &self,
        node: &Node,
    ) -> Result<(bool, bool, Option<InstanceMetadata>), String> {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let exists = self
            .direct(
                self.exists_method(),
                name,
                node_lifecycle::ensure_node_exists(&self.provider, node),
            )
            .await
            .map_err(|e| format!("{}: {}", self.exists_method(), err_text(&e)))?;
        if !exists {
            return Ok((false, false, None));
        }
        let shutdown = self
            .direct(
                self.shutdown_method(),
                name,
                node_lifecycle::shutdown_in_cloud_provider(&self.provider, node),
            )
            .await
            .map_err(|e| format!("{}: {}", self.shutdown_method(), err_text(&e)))?;
        let metadata = if self.caps.instances_v2 {
            self.direct(
                "InstanceMetadata",
                name,
                self.provider.instance_metadata(node),
            )
            .await
        } else {
            // What the node controller puts together from the Instances (and Zones) methods.
            let composed = async {
                node::get_instance_metadata(&self.provider, node)
                    .await
                    .map_err(ProviderError::other)
            };
            self.direct("InstanceMetadata", name, composed).await
        }
        .map_err(|e| format!("{}: {}", self.metadata_method(), err_text(&e)))?;
        Ok((true, shutdown, metadata))
    }

    fn metadata_method(&self) -> &'static str {
        if self.caps.instances_v2 {
            "InstanceMetadata"
        } else {
            "the Instances methods"
        }
    }

    /// The ABI 1.1 bulk lookup against the per-node methods: one `InstancesBatch` call about
    /// every initialised node and the absent one must answer each of them, in order, as
    /// `InstanceExists`, `InstanceShutdown` and `InstanceMetadata` do (the controllers use
    /// either, depending on the provider); a node without an instance is `exists: false`, not
    /// an error.
    async fn instances_batch(&self) -> Outcome {
        let checked: Vec<Arc<Node>> = self.initialised.values().cloned().map(Arc::new).collect();
        let absent = Arc::new(self.absent_node());
        let mut nodes = checked.clone();
        nodes.push(absent.clone());
        let query = InstanceQuery::EXISTS
            .with(InstanceQuery::SHUTDOWN)
            .with(InstanceQuery::METADATA);
        let asked = count(nodes.len(), "node");
        let mut answers = match self
            .direct(
                "InstancesBatch",
                &asked,
                self.provider.instances_batch(&nodes, query),
            )
            .await
        {
            Ok(answers) => answers,
            Err(e) => {
                return Outcome::fail(format!(
                    "InstancesBatch about {asked} ({} and {}, which has no instance): {}",
                    self.initialised
                        .keys()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", "),
                    self.absent.name,
                    err_text(&e)
                ))
            }
        };
        let absent_answer = answers.pop();
        // Problems by node (grouped when several nodes have the same one).
        let mut problems: Vec<(String, String)> = Vec::new();
        // What the per-node methods say about each checked node.
        let mut singles = Vec::new();
        for node in &checked {
            let name = node.metadata.name.clone().unwrap_or_default();
            match self.per_node_answers(node).await {
                Ok(single) => singles.push(Some(single)),
                Err(e) => {
                    problems.push((name, format!("not compared: {e}")));
                    singles.push(None);
                }
            }
        }
        // Whose instance each provider ID is, per the per-node answers (to name an answer given
        // for another node).
        let owners: Vec<(&str, String)> = checked
            .iter()
            .zip(&singles)
            .filter_map(|(n, single)| {
                let md = single.as_ref()?.2.as_ref()?;
                Some((
                    n.metadata.name.as_deref().unwrap_or_default(),
                    normalised_provider_id(md, n),
                ))
            })
            .collect();
        for ((node, answer), single) in checked.iter().zip(answers).zip(&singles) {
            let name = node.metadata.name.as_deref().unwrap_or_default();
            let Some((exists, shutdown, metadata)) = single else {
                continue;
            };
            let status = match answer {
                Ok(status) => status,
                Err(e) => {
                    problems.push((
                        name.to_string(),
                        format!(
                            "InstancesBatch answered {} where {} answers {exists}",
                            err_text(&e),
                            self.exists_method()
                        ),
                    ));
                    continue;
                }
            };
            let differences =
                self.batch_differences(node, &status, *exists, *shutdown, metadata.as_ref());
            if differences.is_empty() {
                continue;
            }
            let mut line = differences.join("; ");
            let someone_else = status
                .metadata
                .as_ref()
                .map(|md| normalised_provider_id(md, node))
                .and_then(|id| owners.iter().find(|(n, p)| *p == id && *n != name));
            if let Some((other, _)) = someone_else {
                line.push_str(&format!(
                    " (that is node {other}'s instance: are the answers in the order of the nodes asked?)"
                ));
            }
            problems.push((name.to_string(), line));
        }
        let absent_name = &self.absent.name;
        let absent_id = provider_id_of(&absent);
        let absent_problem = match absent_answer {
            Some(Ok(status)) if !status.exists => None,
            Some(Ok(_)) => Some(format!(
                "InstancesBatch says the instance of providerID {absent_id:?} exists, but none has that ID ({} says it does not)",
                self.exists_method()
            )),
            Some(Err(e)) => Some(format!(
                "InstancesBatch answered {} for providerID {absent_id:?}, which no instance has; the contract is exists: false, not an error (the lifecycle controller never deletes such a Node otherwise)",
                err_text(&e)
            )),
            None => Some("InstancesBatch gave no answer".to_string()),
        };
        if let Some(problem) = absent_problem {
            problems.push((absent_name.clone(), problem));
        }
        Outcome::from_problems(
            per_node(problems),
            format!(
                "one InstancesBatch about {asked} answers as {}, {} and {} do, in order; {absent_name} (no instance): exists: false",
                self.exists_method(),
                self.shutdown_method(),
                self.metadata_method(),
            ),
        )
    }

    /// How a node's answer in a batch differs from the per-node answers (empty: it agrees).
    fn batch_differences(
        &self,
        node: &Node,
        status: &InstanceStatus,
        exists: bool,
        shutdown: bool,
        metadata: Option<&InstanceMetadata>,
    ) -> Vec<String> {
        let mut out = Vec::new();
        if status.exists != exists {
            out.push(format!(
                "InstancesBatch says exists: {}, {} says {exists}",
                status.exists,
                self.exists_method()
            ));
            return out;
        }
        if !exists {
            return out;
        }
        if status.shutdown != shutdown {
            out.push(format!(
                "InstancesBatch says shutdown: {}, {} says {shutdown}",
                status.shutdown,
                self.shutdown_method()
            ));
        }
        let method = self.metadata_method();
        match (&status.metadata, metadata) {
            (None, None) => {}
            (Some(_), None) => out.push(format!(
                "InstancesBatch returns metadata, {method} none (nil)"
            )),
            (None, Some(_)) => out.push(format!(
                "InstancesBatch returns no metadata (nil), {method} does"
            )),
            (Some(batch), Some(single)) => {
                let mut fields = Vec::new();
                let (batch_id, single_id) = (
                    normalised_provider_id(batch, node),
                    normalised_provider_id(single, node),
                );
                if batch_id != single_id {
                    fields.push(format!("providerID {batch_id:?} / {single_id:?}"));
                }
                if batch.instance_type != single.instance_type {
                    fields.push(format!(
                        "instance type {:?} / {:?}",
                        batch.instance_type, single.instance_type
                    ));
                }
                if batch.node_addresses != single.node_addresses {
                    let list = |md: &InstanceMetadata| {
                        md.node_addresses
                            .iter()
                            .map(|a| format!("{}={}", a.type_, a.address))
                            .collect::<Vec<_>>()
                            .join(" ")
                    };
                    fields.push(format!("addresses [{}] / [{}]", list(batch), list(single)));
                }
                // The Instances methods have no zone (the Zones ones do) nor extra labels.
                let zones = self.caps.instances_v2 || self.caps.zones;
                if zones && (batch.zone != single.zone || batch.region != single.region) {
                    fields.push(format!(
                        "zone/region {}/{} / {}/{}",
                        batch.zone, batch.region, single.zone, single.region
                    ));
                }
                if self.caps.instances_v2 && batch.additional_labels != single.additional_labels {
                    fields.push(format!(
                        "additional labels {:?} / {:?}",
                        batch.additional_labels, single.additional_labels
                    ));
                }
                if !fields.is_empty() {
                    out.push(format!(
                        "metadata differs (InstancesBatch / {method}): {}",
                        fields.join(", ")
                    ));
                }
            }
        }
        out
    }

    /// One pass of the real lifecycle controller over the scene plus a NotReady node whose
    /// instance does not exist.
    async fn node_lifecycle(&mut self) -> Outcome {
        let absent = scene::node(&self.absent, "Unknown", false);
        if let Err(e) = self.server.controls().seed(absent) {
            return Outcome::fail(format!("could not create the absent node: {e}"));
        }
        // The pass works on the node cache: wait until it holds the current scene.
        let names: Vec<String> = self
            .scene_nodes()
            .into_iter()
            .map(|s| s.name)
            .chain([self.absent.name.clone()])
            .collect();
        let cached = self
            .wait_for(|| {
                // Same resourceVersion in the cache as in the store (re-read on every poll:
                // the node controller may still be writing).
                let ok = names.iter().all(|n| {
                    let cached = self.ctx.nodes.store().get(n);
                    cached.and_then(|c| c.resource_version().map(String::from))
                        == self
                            .stored_node(n)
                            .and_then(|s| s.metadata.resource_version)
                });
                async move { ok.then_some(()) }
            })
            .await;
        if cached.is_none() {
            return Outcome::fail("the node cache did not catch up with the scene");
        }
        let before: BTreeMap<String, Node> = self
            .scene_nodes()
            .iter()
            .filter_map(|s| Some((s.name.clone(), self.stored_node(&s.name)?)))
            .collect();
        let ctx = self.ctx.for_controller(node_lifecycle::NAME);
        let recorder = ctx.recorder(node_lifecycle::COMPONENT);
        node_lifecycle::monitor_nodes(&ctx, &recorder).await;

        let mut problems = Vec::new();
        if self.stored_node(&self.absent.name).is_some() {
            let why = match self
                .direct(
                    self.exists_method(),
                    &self.absent.name,
                    node_lifecycle::ensure_node_exists(&self.provider, &self.absent_node()),
                )
                .await
            {
                Ok(true) => format!("{} says it exists", self.exists_method()),
                Ok(false) => "the deletion failed; see the log".to_string(),
                Err(e) => format!("{}: {}", self.exists_method(), err_text(&e)),
            };
            problems.push(format!(
                "NotReady node {} (providerID {}) was not deleted although its instance does not exist: {why}",
                self.absent.name,
                self.absent.provider_id.as_deref().unwrap_or_default()
            ));
        }
        let stopped = self.plan.shutdown_node.as_ref().map(|s| s.name.as_str());
        let mut deleted = Vec::new();
        for spec in self.scene_nodes() {
            let name = spec.name.as_str();
            let Some(node) = self.stored_node(name) else {
                let why = match before.get(name) {
                    None => "it did not exist before the pass".to_string(),
                    Some(copy) => match self
                        .direct(
                            self.exists_method(),
                            name,
                            node_lifecycle::ensure_node_exists(&self.provider, copy),
                        )
                        .await
                    {
                        Ok(false) => format!(
                            "{} says its instance does not exist (the check nodes must be instances the provider knows)",
                            self.exists_method()
                        ),
                        Ok(true) => format!(
                            "{} now says its instance exists",
                            self.exists_method()
                        ),
                        Err(e) => format!("{}: {}", self.exists_method(), err_text(&e)),
                    },
                };
                deleted.push((
                    name.to_string(),
                    format!("deleted by the lifecycle controller: {why}"),
                ));
                continue;
            };
            let tainted = has_taint(&node, SHUTDOWN_TAINT);
            if Some(name) == stopped && !tainted {
                problems.push(format!(
                    "stopped node {name} did not get the {SHUTDOWN_TAINT} taint"
                ));
            }
            if Some(name) != stopped && tainted {
                problems.push(format!(
                    "running node {name} got the {SHUTDOWN_TAINT} taint"
                ));
            }
        }
        problems.extend(per_node(deleted));
        let mut detail = format!(
            "absent node deleted, {} kept",
            count(self.plan.nodes.len(), "running node")
        );
        if let Some(s) = stopped {
            detail.push_str(&format!(", stopped node {s} tainted {SHUTDOWN_TAINT}"));
        }
        Outcome::from_problems(problems, detail)
    }
}
