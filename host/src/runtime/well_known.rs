//! Well-known keys of the Kubernetes API that the controllers read and write: taints, labels,
//! annotations, the load-balancer cleanup finalizer and node condition types. Upstream spreads
//! them over k8s.io/api, k8s.io/cloud-provider and the cluster autoscaler; here they live in one
//! place and every controller imports them from it.

// Taints (matched by key only).

/// The taint kubelet sets on nodes of an external cloud provider until the node controller
/// initialises them.
pub const UNINITIALIZED_TAINT: &str = "node.cloudprovider.kubernetes.io/uninitialized";
/// The taint of nodes whose instance is shut down (node lifecycle controller).
pub const SHUTDOWN_TAINT: &str = "node.cloudprovider.kubernetes.io/shutdown";
/// The cluster autoscaler's taint on nodes it is about to delete (left out of load balancers).
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

// Labels.

/// Instance-type label written at initialisation.
pub const INSTANCE_TYPE_LABEL: &str = "node.kubernetes.io/instance-type";
/// Deprecated instance-type label, still written and reconciled with [`INSTANCE_TYPE_LABEL`].
pub const INSTANCE_TYPE_BETA_LABEL: &str = "beta.kubernetes.io/instance-type";
/// Zone label written at initialisation.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// Deprecated zone label, still written and reconciled with [`ZONE_LABEL`].
pub const ZONE_BETA_LABEL: &str = "failure-domain.beta.kubernetes.io/zone";
/// Region label written at initialisation.
pub const REGION_LABEL: &str = "topology.kubernetes.io/region";
/// Deprecated region label, still written and reconciled with [`REGION_LABEL`].
pub const REGION_BETA_LABEL: &str = "failure-domain.beta.kubernetes.io/region";
/// Node label that excludes a node from load-balancer host sets.
pub const EXCLUDE_LB_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

// Annotations.

/// Annotation set by kubelet `--node-ip` when the cloud provider is external.
pub const PROVIDED_NODE_IP_ANNOTATION: &str = "alpha.kubernetes.io/provided-node-ip";
/// kubectl's client-side apply record: a copy of the whole object in an annotation.
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Beyond upstream, with several providers in one host (hybrid clusters): the provider whose
/// load balancer a Service has, written with the cleanup finalizer.
pub const LB_PROVIDER_ANNOTATION: &str = "ccm-host/load-balancer-provider";

// Service condition types.

/// Beyond upstream, with ownership enforced: the host's own record of the provider whose load
/// balancer a Service has, a `status.conditions` entry (message: the provider's name) written
/// through `services/status` with the cleanup finalizer. Unlike [`LB_PROVIDER_ANNOTATION`] it
/// cannot be changed by whoever may edit the Service.
pub const LB_PROVIDER_CONDITION: &str = "ccm-host/LoadBalancerProvider";
/// The reason of [`LB_PROVIDER_CONDITION`].
pub const LB_PROVIDER_CONDITION_REASON: &str = "LoadBalancerProvisioned";

// Finalizers.

/// The finalizer that keeps a Service until its load balancer is gone.
pub const LB_CLEANUP_FINALIZER: &str = "service.kubernetes.io/load-balancer-cleanup";

// Node condition types.

/// The node condition kubelet keeps up to date.
pub const READY_CONDITION: &str = "Ready";
/// The node condition the route controller sets once the node's route exists.
pub const NETWORK_UNAVAILABLE_CONDITION: &str = "NetworkUnavailable";
