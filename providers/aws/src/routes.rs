//! Routes: pod CIDRs routed to instances in the cluster's VPC route table(s).
//!
//! The tables are `RouteTableID` from the cloud config (one or several), else every route
//! table tagged with the cluster tag (`kubernetes.io/cluster/<id>`, or the legacy
//! `KubernetesCluster`). Unlike the AWS CCM, which refuses more than one tagged table, every
//! table gets every route (a VPC with a route table per zone).
//!
//! - `ListRoutes` reports the routes whose target is an instance or that are blackholes;
//!   local and gateway routes are never reported, so the route controller never touches
//!   them. A route whose instance is terminated is reported as a blackhole (as AWS marks it;
//!   moto keeps it `active`), and so is a route that is not the same in every table (missing
//!   in one, or another target): the controller deletes it and creates it again everywhere.
//! - `CreateRoute` turns the instance's source/destination check off (routed pod traffic
//!   needs it, as the AWS CCM does), replaces a blackhole or a route to another instance, and
//!   adds the route to every table that lacks it.
//! - `DeleteRoute` deletes the destination from every table where it targets an instance or
//!   is a blackhole.
//!
//! `ListRoutes` always reads the tables; the creations and deletions the route controller then
//! makes (up to 200 at once) decide from that snapshot (at most 10 s old), updated with what
//! they did, instead of each reading every table again. A `RouteAlreadyExists` answer shows a
//! stale snapshot: the tables are read again and the decision made once more.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ccm_provider_abi::prelude::*;
use ccm_provider_abi::sdk::Result;

use crate::api::ec2::{RouteEntry, RouteTable};
use crate::cloud::AwsContext;
use crate::instances::{key_of, Key};
use crate::runtime::AwsRuntime;
use crate::tags;

/// How old a snapshot of the route tables `CreateRoute` and `DeleteRoute` may use. The route
/// controller lists the routes and then creates and deletes many at once (200 calls at a
/// time): they share the listing's snapshot instead of each reading every table (a table of
/// 500 routes is ~150 KB of XML; read per call that was O(n²) bytes and hundreds of MB in
/// flight).
const SNAPSHOT_MAX_AGE: Duration = Duration::from_secs(10);

/// The route tables as last read, with the cluster ID they were read for.
struct Snapshot {
    at: Instant,
    cluster_id: String,
    tables: Arc<Vec<RouteTable>>,
}

/// The `aws` Routes.
pub struct AwsRoutes {
    work: Arc<RouteWork>,
    rt: Arc<AwsRuntime>,
}

/// The work of [`AwsRoutes`], shared with the tasks it runs on the provider's runtime.
struct RouteWork {
    cx: Arc<AwsContext>,
    snapshot: tokio::sync::Mutex<Option<Snapshot>>,
    /// Instances whose source/destination check this provider turned off.
    unchecked: Mutex<HashSet<String>>,
}

fn is_v6(cidr: &str) -> bool {
    cidr.contains(':')
}

/// The routes of one destination across the tables.
#[derive(Debug, Default)]
struct Across {
    /// `(table, instance, blackhole)` per table that has it.
    entries: Vec<(String, Option<String>, bool)>,
}

impl AwsRoutes {
    /// Routes over the provider's context and runtime.
    pub fn new(cx: Arc<AwsContext>, rt: Arc<AwsRuntime>) -> Self {
        Self {
            work: Arc::new(RouteWork {
                cx,
                snapshot: tokio::sync::Mutex::new(None),
                unchecked: Mutex::new(HashSet::new()),
            }),
            rt,
        }
    }
}

impl RouteWork {
    /// The route tables, read again when the snapshot is older than `max_age` (one reader at
    /// a time; concurrent callers share its answer).
    async fn snapshot(&self, cluster_id: &str, max_age: Duration) -> Result<Arc<Vec<RouteTable>>> {
        let mut snap = self.snapshot.lock().await;
        if let Some(s) = snap.as_ref() {
            if s.cluster_id == cluster_id && s.at.elapsed() <= max_age {
                return Ok(s.tables.clone());
            }
        }
        let tables = Arc::new(self.tables(cluster_id).await?);
        *snap = Some(Snapshot {
            at: Instant::now(),
            cluster_id: cluster_id.to_string(),
            tables: tables.clone(),
        });
        Ok(tables)
    }

    /// Record in the snapshot what this provider just did to `table`: `dest` now routes to
    /// `instance` (`None`: deleted).
    async fn note(&self, table: &str, dest: &str, instance: Option<&str>) {
        let mut snap = self.snapshot.lock().await;
        let Some(s) = snap.as_mut() else {
            return;
        };
        let tables = Arc::make_mut(&mut s.tables);
        if let Some(t) = tables.iter_mut().find(|t| t.id == table) {
            t.routes.retain(|r| r.destination != dest);
            if let Some(i) = instance {
                t.routes.push(RouteEntry {
                    destination: dest.to_string(),
                    ipv6: is_v6(dest),
                    instance_id: Some(i.to_string()),
                    gateway_id: None,
                    state: "active".into(),
                });
            }
        }
    }

    /// Forget the snapshot (an answer showed it is stale).
    async fn forget_snapshot(&self) {
        *self.snapshot.lock().await = None;
    }

    /// Add `dest` → `instance` to every table, replacing a blackhole or a route to another
    /// instance, from the snapshot; `Err(true)` when AWS said the snapshot was stale.
    async fn add_everywhere(
        &self,
        cluster_id: &str,
        dest: &str,
        instance: &str,
        max_age: Duration,
    ) -> Result<std::result::Result<(), bool>> {
        let v6 = is_v6(dest);
        for table in self.snapshot(cluster_id, max_age).await?.iter() {
            match table.routes.iter().find(|r| r.destination == dest) {
                Some(r) if r.instance_id.as_deref() == Some(instance) && r.state != "blackhole" => {
                    continue
                }
                Some(r) if r.instance_id.is_some() || r.state == "blackhole" => {
                    log::info!(
                        "aws: replacing route {dest} in {} (was {}, {})",
                        table.id,
                        r.instance_id.as_deref().unwrap_or("no instance"),
                        r.state
                    );
                    match self.cx.api.delete_route(&table.id, dest, v6).await {
                        Ok(()) => {}
                        Err(e) if e.code() == "InvalidRoute.NotFound" => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Some(_) => {
                    return Err(ProviderError::other(format!(
                        "route table {} already routes {dest} to a gateway; not changing it",
                        table.id
                    )))
                }
                None => {}
            }
            match self
                .cx
                .api
                .create_route(&table.id, dest, v6, instance)
                .await
            {
                Ok(()) => self.note(&table.id, dest, Some(instance)).await,
                Err(e) if e.code() == "RouteAlreadyExists" => return Ok(Err(true)),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Ok(()))
    }

    async fn tables(&self, cluster_id: &str) -> Result<Vec<RouteTable>> {
        let ids = &self.cx.config.route_table_ids;
        if !ids.is_empty() {
            let found = self
                .cx
                .api
                .describe_route_tables(&[("route-table-id", &ids[..])])
                .await?;
            if let Some(missing) = ids.iter().find(|id| !found.iter().any(|t| t.id == **id)) {
                return Err(ProviderError::other(format!(
                    "route table {missing} (RouteTableID in the cloud config) does not exist"
                )));
            }
            return Ok(found);
        }
        let mut filters: Vec<(&str, Vec<String>)> =
            vec![("tag-key", vec![tags::cluster_tag(cluster_id)])];
        if let Some(vpc) = &self.cx.config.vpc {
            filters.push(("vpc-id", vec![vpc.clone()]));
        }
        let as_refs: Vec<(&str, &[String])> = filters.iter().map(|(k, v)| (*k, &v[..])).collect();
        let mut found = self.cx.api.describe_route_tables(&as_refs).await?;
        if found.is_empty() {
            let mut legacy: Vec<(&str, Vec<String>)> =
                vec![("tag:KubernetesCluster", vec![cluster_id.to_string()])];
            if let Some(vpc) = &self.cx.config.vpc {
                legacy.push(("vpc-id", vec![vpc.clone()]));
            }
            let as_refs: Vec<(&str, &[String])> =
                legacy.iter().map(|(k, v)| (*k, &v[..])).collect();
            found = self.cx.api.describe_route_tables(&as_refs).await?;
        }
        if found.is_empty() {
            return Err(ProviderError::other(format!(
                "unable to find a route table for cluster {cluster_id}: tag it {}=owned (or shared), or set RouteTableID in the cloud config",
                tags::cluster_tag(cluster_id)
            )));
        }
        Ok(found)
    }

    /// The routes to report, by destination, and the instance IDs they target.
    async fn collect(
        &self,
        cluster_id: &str,
    ) -> Result<(usize, BTreeMap<String, Across>, HashMap<String, String>)> {
        let tables = self.snapshot(cluster_id, Duration::ZERO).await?;
        let mut by_dest: BTreeMap<String, Across> = BTreeMap::new();
        for t in tables.iter() {
            for r in &t.routes {
                let blackhole = r.state == "blackhole";
                if r.instance_id.is_none() && !blackhole {
                    continue;
                }
                by_dest
                    .entry(r.destination.clone())
                    .or_default()
                    .entries
                    .push((t.id.clone(), r.instance_id.clone(), blackhole));
            }
        }
        let mut ids: Vec<String> = by_dest
            .values()
            .flat_map(|a| a.entries.iter().filter_map(|(_, i, _)| i.clone()))
            .collect();
        ids.sort();
        ids.dedup();
        // Instance states: a route to a terminated (or vanished) instance is a blackhole.
        let mut states = HashMap::new();
        for chunk in ids.chunks(crate::api::ec2::FILTER_VALUES_PER_CALL) {
            for i in self
                .cx
                .api
                .describe_instances(&[("instance-id", chunk)])
                .await?
            {
                states.insert(i.id, i.state);
            }
        }
        Ok((tables.len(), by_dest, states))
    }

    async fn instance_for(&self, node_name: &str) -> Result<String> {
        let node: Node =
            serde_json::from_value(serde_json::json!({"metadata": {"name": node_name}}))
                .map_err(|e| ProviderError::other(e.to_string()))?;
        let key = key_of(&node)?;
        if let Key::Id(id) = &key {
            return Ok(id.clone());
        }
        let found = self.cx.lookup(std::slice::from_ref(&key)).await?;
        found.get(&key).map(|i| i.id.clone()).ok_or_else(|| {
            ProviderError::instance_not_found().context(format!("route target node {node_name:?}"))
        })
    }
}

impl Routes for AwsRoutes {
    fn list_routes(&self, ctx: &CallContext, cluster_name: &str) -> Result<Vec<Route>> {
        let cluster_id = self.work.cx.cluster_id_or(cluster_name).to_string();
        let w = self.work.clone();
        let (tables, by_dest, states) = self
            .rt
            .run(ctx, async move { w.collect(&cluster_id).await })?;
        let ids: Vec<String> = states.keys().cloned().collect();
        let names = self.work.cx.node_names(&self.rt, ctx, &ids)?;
        let mut out = Vec::new();
        for (dest, across) in by_dest {
            let targets: Vec<&Option<String>> = across.entries.iter().map(|(_, i, _)| i).collect();
            let first = targets.first().and_then(|t| (*t).clone());
            let dead = across.entries.iter().any(|(_, i, b)| {
                *b || i
                    .as_ref()
                    .is_some_and(|id| states.get(id).is_none_or(|s| s == "terminated"))
            });
            let consistent = across.entries.len() == tables && targets.iter().all(|t| **t == first);
            let target_node = first
                .as_ref()
                .and_then(|id| names.get(id).cloned())
                .unwrap_or_default();
            out.push(Route {
                name: format!("{cluster_name}-{dest}"),
                target_node,
                destination_cidr: dest,
                blackhole: dead || !consistent,
                ..Default::default()
            });
        }
        Ok(out)
    }

    fn create_route(
        &self,
        ctx: &CallContext,
        cluster_name: &str,
        _name_hint: &str,
        route: &Route,
    ) -> Result<()> {
        let cluster_id = self.work.cx.cluster_id_or(cluster_name).to_string();
        let dest = route.destination_cidr.clone();
        if dest.parse::<ipnet::IpNet>().is_err() {
            return Err(ProviderError::other(format!(
                "route destination {dest:?} is not a CIDR"
            )));
        }
        let known = self.work.cx.instance_of_node(ctx, &route.target_node);
        let (w, target) = (self.work.clone(), route.target_node.clone());
        self.rt.run(ctx, async move {
            let instance = match known {
                Some(id) => id,
                None => w.instance_for(&target).await?,
            };
            w.cx.remember_node(&instance, &target);
            let done = w.unchecked.lock().expect("unchecked").contains(&instance);
            if !done {
                w.cx.api.set_source_dest_check(&instance, false).await?;
                w.unchecked
                    .lock()
                    .expect("unchecked")
                    .insert(instance.clone());
            }
            match w
                .add_everywhere(&cluster_id, &dest, &instance, SNAPSHOT_MAX_AGE)
                .await?
            {
                Ok(()) => Ok(()),
                // The snapshot was stale (someone else added the route): read the tables again
                // and decide once more.
                Err(_) => {
                    w.forget_snapshot().await;
                    match w
                        .add_everywhere(&cluster_id, &dest, &instance, Duration::ZERO)
                        .await?
                    {
                        Ok(()) => Ok(()),
                        Err(_) => {
                            log::info!("aws: route {dest} already exists");
                            Ok(())
                        }
                    }
                }
            }
        })
    }

    fn delete_route(&self, ctx: &CallContext, cluster_name: &str, route: &Route) -> Result<()> {
        let cluster_id = self.work.cx.cluster_id_or(cluster_name).to_string();
        let dest = route.destination_cidr.clone();
        let w = self.work.clone();
        self.rt.run(ctx, async move {
            for table in w.snapshot(&cluster_id, SNAPSHOT_MAX_AGE).await?.iter() {
                let Some(r) = table.routes.iter().find(|r| r.destination == dest) else {
                    continue;
                };
                // Never a local or gateway route: only what a CreateRoute could have made.
                if r.instance_id.is_none() && r.state != "blackhole" {
                    continue;
                }
                match w.cx.api.delete_route(&table.id, &dest, r.ipv6).await {
                    Ok(()) => w.note(&table.id, &dest, None).await,
                    Err(e) if e.code() == "InvalidRoute.NotFound" => {
                        w.note(&table.id, &dest, None).await
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Ok(())
        })
    }
}
