//! # ccm-provider-aws
//!
//! The AWS provider plugin, registered as `aws`, behaving like the AWS cloud-controller-manager
//! (`kubernetes/cloud-provider-aws`) for what it covers:
//!
//! - **InstancesV2** and bulk lookups from EC2 DescribeInstances ([`instances`]): provider IDs
//!   `aws:///<zone>/<instance-id>`, addresses in the AWS CCM's order, instance type, zone,
//!   region and the `topology.k8s.aws/zone-id` label; stopped = shut down, terminated = gone.
//! - **LoadBalancer** as a classic ELB per Service (the AWS CCM's default) or, with
//!   `aws-load-balancer-type: nlb`, a network load balancer ([`loadbalancer`]), with the AWS
//!   CCM's `service.beta.kubernetes.io/aws-load-balancer-*` annotations ([`annotations`]) and
//!   security groups ([`securitygroups`]).
//! - **Routes** in the cluster's VPC route table(s) ([`routes`]).
//!
//! The cloud config is the AWS CCM's INI file ([`config`]); credentials come from the AWS SDK's
//! own chain ([`credentials`]); EC2, ELBv2 and classic ELB are called through a small Query-API client
//! signed with the SDK's SigV4 ([`api`]). Each provider instance runs its calls on its own
//! tokio runtime, bounded by the host's call deadline and cancellation ([`runtime`]).
//!
//! Reference: `docs/aws-provider.md`.

pub mod annotations;
pub mod api;
pub mod cloud;
pub mod config;
pub mod credentials;
pub mod instances;
pub mod loadbalancer;
pub mod region;
pub mod routes;
pub mod runtime;
pub mod securitygroups;
pub mod tags;

pub use cloud::AwsCloud;

use ccm_provider_abi::prelude::*;

/// The registered provider name, and the scheme of its provider IDs.
pub const AWS: &str = "aws";

/// Registers `aws` (upstream `RegisterCloudProvider`).
pub fn register(r: &mut Registrar) -> Result<(), ProviderError> {
    r.register(AWS, AwsCloud::new)
}

ccm_provider_abi::export_plugin!(register);
