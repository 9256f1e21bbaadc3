//! Prometheus metrics with upstream names (docs/upstream-compat.md#metrics), in one registry served at `/metrics`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Labels of `running_managed_controllers`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    /// Short controller name (`cloud-node`, `service`, ...).
    pub name: String,
    /// Always `cloud-controller-manager`.
    pub manager: String,
}

/// Labels of the workqueue metrics: the queue's name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    /// Queue name (`node`, `service`, ...).
    pub name: String,
}

type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

fn queue_latency() -> Histogram {
    // client-go: 10 ns .. 10^9 ns (1e-8 s .. 10 s), ten buckets.
    Histogram::new(exponential_buckets(1e-8, 10.0, 10))
}

/// client-go's workqueue metrics, one series per queue name.
#[derive(Clone)]
pub struct WorkqueueMetrics {
    depth: Family<QueueLabels, Gauge>,
    adds: Family<QueueLabels, Counter>,
    queue_duration: Family<QueueLabels, Histogram, fn() -> Histogram>,
    work_duration: Family<QueueLabels, Histogram, fn() -> Histogram>,
    retries: Family<QueueLabels, Counter>,
    unfinished_work: Family<QueueLabels, FloatGauge>,
    longest_running: Family<QueueLabels, FloatGauge>,
}

impl Default for WorkqueueMetrics {
    fn default() -> Self {
        Self {
            depth: Family::default(),
            adds: Family::default(),
            queue_duration: Family::new_with_constructor(queue_latency),
            work_duration: Family::new_with_constructor(queue_latency),
            retries: Family::default(),
            unfinished_work: Family::default(),
            longest_running: Family::default(),
        }
    }
}

/// The series of one queue.
#[derive(Clone)]
pub struct QueueMetrics {
    /// `workqueue_depth`.
    pub depth: Gauge,
    /// `workqueue_adds_total`.
    pub adds: Counter,
    /// `workqueue_queue_duration_seconds`.
    pub queue_duration: Histogram,
    /// `workqueue_work_duration_seconds`.
    pub work_duration: Histogram,
    /// `workqueue_retries_total`.
    pub retries: Counter,
    /// `workqueue_unfinished_work_seconds`.
    pub unfinished_work: FloatGauge,
    /// `workqueue_longest_running_processor_seconds`.
    pub longest_running: FloatGauge,
}

impl WorkqueueMetrics {
    /// Register the families in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "workqueue_depth",
            "Current depth of workqueue",
            self.depth.clone(),
        );
        registry.register(
            "workqueue_adds",
            "Total number of adds handled by workqueue",
            self.adds.clone(),
        );
        registry.register(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
            self.queue_duration.clone(),
        );
        registry.register(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes",
            self.work_duration.clone(),
        );
        registry.register(
            "workqueue_retries",
            "Total number of retries handled by workqueue",
            self.retries.clone(),
        );
        registry.register(
            "workqueue_unfinished_work_seconds",
            "How many seconds of work has been done that is in progress and hasn't been observed by work_duration",
            self.unfinished_work.clone(),
        );
        registry.register(
            "workqueue_longest_running_processor_seconds",
            "How many seconds has the longest running processor for workqueue been running",
            self.longest_running.clone(),
        );
    }

    /// The series of the queue called `name`.
    pub fn queue(&self, name: &str) -> QueueMetrics {
        let l = QueueLabels {
            name: name.to_string(),
        };
        QueueMetrics {
            depth: self.depth.get_or_create(&l).clone(),
            adds: self.adds.get_or_create(&l).clone(),
            queue_duration: self.queue_duration.get_or_create(&l).clone(),
            work_duration: self.work_duration.get_or_create(&l).clone(),
            retries: self.retries.get_or_create(&l).clone(),
            unfinished_work: self.unfinished_work.get_or_create(&l).clone(),
            longest_running: self.longest_running.get_or_create(&l).clone(),
        }
    }
}

/// Every metric the controllers update.
pub struct Metrics {
    /// `running_managed_controllers{name,manager}`.
    pub running_managed_controllers: Family<ControllerLabels, Gauge>,
    /// `node_controller_cloud_provider_taint_removal_delay_seconds`.
    pub node_taint_removal_delay: Histogram,
    /// `node_controller_initial_node_sync_delay_seconds`.
    pub node_initial_sync_delay: Histogram,
    /// `service_controller_loadbalancer_sync_total`.
    pub service_lb_sync_total: Counter,
    /// `service_controller_nodesync_error_total`.
    pub service_nodesync_error_total: Counter,
    /// `service_controller_nodesync_latency_seconds`.
    pub service_nodesync_latency: Histogram,
    /// `service_controller_update_loadbalancer_host_latency_seconds`.
    pub service_update_lb_host_latency: Histogram,
    /// `route_controller_route_sync_total`.
    pub route_sync_total: Counter,
    /// `ccm_node_deletions_total` (beyond upstream): Nodes the lifecycle controller deleted
    /// because their instance does not exist in the cloud.
    pub node_deletions: Counter,
    /// `ccm_node_deletions_withheld_total` (beyond upstream): deletions withheld by
    /// `--node-deletion-mode=report`, one per node and run of "does not exist" answers.
    pub node_deletions_withheld: Counter,
    /// client-go's workqueue metrics of the controllers' queues.
    pub workqueue: WorkqueueMetrics,
}

impl Metrics {
    /// Create the metrics and register them in `registry`.
    pub fn new(registry: &mut Registry) -> Self {
        let node_buckets = || Histogram::new([1.0, 4.0, 16.0, 64.0, 256.0, 1024.0]);
        let service_buckets = || Histogram::new(exponential_buckets(1.0, 2.0, 15));
        let m = Self {
            running_managed_controllers: Family::default(),
            node_taint_removal_delay: node_buckets(),
            node_initial_sync_delay: node_buckets(),
            service_lb_sync_total: Counter::default(),
            service_nodesync_error_total: Counter::default(),
            service_nodesync_latency: service_buckets(),
            service_update_lb_host_latency: service_buckets(),
            route_sync_total: Counter::default(),
            node_deletions: Counter::default(),
            node_deletions_withheld: Counter::default(),
            workqueue: WorkqueueMetrics::default(),
        };
        m.workqueue.register(registry);
        registry.register(
            "running_managed_controllers",
            "Indicates where instances of a controller are currently running",
            m.running_managed_controllers.clone(),
        );
        registry.register(
            "node_controller_cloud_provider_taint_removal_delay_seconds",
            "Number of seconds after node creation when NodeController removed the cloud-provider taint of a single node",
            m.node_taint_removal_delay.clone(),
        );
        registry.register(
            "node_controller_initial_node_sync_delay_seconds",
            "Number of seconds after node creation when NodeController finished the initial synchronization of a single node",
            m.node_initial_sync_delay.clone(),
        );
        // prometheus-client appends `_total` to counters itself.
        registry.register(
            "service_controller_loadbalancer_sync",
            "A metric counting the amount of times any load balancer has been configured, as an effect of service/node changes on the cluster",
            m.service_lb_sync_total.clone(),
        );
        registry.register(
            "service_controller_nodesync_error",
            "A metric counting the amount of times any load balancer has been configured and errored, as an effect of node changes on the cluster",
            m.service_nodesync_error_total.clone(),
        );
        registry.register(
            "service_controller_nodesync_latency_seconds",
            "A metric measuring the latency for nodesync which updates loadbalancer hosts on cluster node updates",
            m.service_nodesync_latency.clone(),
        );
        registry.register(
            "service_controller_update_loadbalancer_host_latency_seconds",
            "A metric measuring the latency for updating each load balancer hosts",
            m.service_update_lb_host_latency.clone(),
        );
        registry.register(
            "route_controller_route_sync",
            "A metric counting the amount of times routes have been synced with the cloud provider",
            m.route_sync_total.clone(),
        );
        registry.register(
            "ccm_node_deletions",
            "Nodes the cloud-node-lifecycle controller deleted because their instance does not exist in the cloud",
            m.node_deletions.clone(),
        );
        registry.register(
            "ccm_node_deletions_withheld",
            "Node deletions the cloud-node-lifecycle controller withheld because of --node-deletion-mode=report, one per node and run of 'does not exist' answers",
            m.node_deletions_withheld.clone(),
        );
        m
    }

    /// Set `running_managed_controllers{name}` to 1 (started) or 0 (stopped).
    pub fn set_running(&self, short_name: &str, running: bool) {
        self.running_managed_controllers
            .get_or_create(&ControllerLabels {
                name: short_name.to_string(),
                manager: "cloud-controller-manager".to_string(),
            })
            .set(i64::from(running));
    }
}

/// Render `registry` in the Prometheus text format.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    merge_families(&out)
}

/// One metric family per name. prometheus-client writes a family for every registration, so the
/// per-provider registrations of a hybrid cluster (the same metric under another `provider`
/// label) would repeat `# HELP`/`# TYPE`, which OpenMetrics forbids; here the samples of a
/// repeated family join its first block. A text without repeats comes back unchanged.
pub fn merge_families(text: &str) -> String {
    // Blocks in order: (family name, header lines, sample lines).
    let mut blocks: Vec<(String, Vec<&str>, Vec<&str>)> = Vec::new();
    let mut index: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut current: Option<usize> = None;
    let mut eof = false;
    for line in text.lines() {
        if line == "# EOF" {
            eof = true;
            continue;
        }
        let header = ["# HELP ", "# TYPE ", "# UNIT "]
            .iter()
            .find_map(|p| line.strip_prefix(p));
        match header {
            Some(rest) => {
                let name = rest.split(' ').next().unwrap_or_default().to_string();
                let at = *index.entry(name.clone()).or_insert_with(|| {
                    blocks.push((name, Vec::new(), Vec::new()));
                    blocks.len() - 1
                });
                // A repeated family's headers are dropped, not repeated.
                if current != Some(at) && !blocks[at].2.is_empty() {
                    current = Some(at);
                    continue;
                }
                if !blocks[at].1.contains(&line) {
                    blocks[at].1.push(line);
                }
                current = Some(at);
            }
            None => match current {
                Some(at) => blocks[at].2.push(line),
                None => {
                    blocks.push((String::new(), Vec::new(), vec![line]));
                    current = Some(blocks.len() - 1);
                }
            },
        }
    }
    let mut out = String::with_capacity(text.len());
    for (_, headers, samples) in &blocks {
        for line in headers.iter().chain(samples) {
            out.push_str(line);
            out.push('\n');
        }
    }
    if eof {
        out.push_str("# EOF\n");
    }
    out
}

#[cfg(test)]
mod merge_tests {
    use super::merge_families;

    #[test]
    fn repeated_families_are_merged_and_others_kept() {
        let text = "# HELP a_total A.\n# TYPE a_total counter\na_total{provider=\"x\"} 1\n\
                    # HELP b B.\n# TYPE b gauge\nb 2\n\
                    # HELP a_total A.\n# TYPE a_total counter\na_total{provider=\"y\"} 3\n# EOF\n";
        assert_eq!(
            merge_families(text),
            "# HELP a_total A.\n# TYPE a_total counter\na_total{provider=\"x\"} 1\na_total{provider=\"y\"} 3\n\
             # HELP b B.\n# TYPE b gauge\nb 2\n# EOF\n"
        );
        let single = "# HELP b B.\n# TYPE b gauge\nb 2\n# EOF\n";
        assert_eq!(merge_families(single), single);
    }
}
