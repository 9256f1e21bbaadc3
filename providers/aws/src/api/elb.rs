//! The classic ELB calls (Query API `2012-06-01`, same endpoint and signing name as ELBv2):
//! load balancers, listeners, health check, instances, attributes, policies, security groups,
//! subnets and tags.

use std::collections::BTreeMap;

use roxmltree::Node;

use super::xml::{child, list, number, result, string, tags};
use super::{parse, AwsClient, AwsError, Params};

/// Instances per Register/DeregisterInstances call.
const INSTANCES_PER_CALL: usize = 100;
/// Load balancers per DescribeTags call (the API's limit).
const TAGS_PER_CALL: usize = 20;

/// One listener of a classic ELB.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct ClassicListener {
    /// Frontend port.
    pub port: u16,
    /// Frontend protocol (`TCP`, `SSL`, `HTTP`, `HTTPS`; compared case-insensitively).
    pub protocol: String,
    /// The NodePort.
    pub instance_port: u16,
    /// Backend protocol.
    pub instance_protocol: String,
    /// Certificate ARN (SSL/HTTPS).
    pub certificate: Option<String>,
}

impl ClassicListener {
    /// Whether `self` and `other` are the same listener (protocols and certificate compared
    /// case-insensitively, as the AWS CCM compares them).
    pub fn same_as(&self, other: &ClassicListener) -> bool {
        let eq = |a: &Option<String>, b: &Option<String>| match (a, b) {
            (None, None) => true,
            (Some(a), Some(b)) => a.eq_ignore_ascii_case(b),
            _ => false,
        };
        self.port == other.port
            && self.instance_port == other.instance_port
            && self.protocol.eq_ignore_ascii_case(&other.protocol)
            && self
                .instance_protocol
                .eq_ignore_ascii_case(&other.instance_protocol)
            && eq(&self.certificate, &other.certificate)
    }
}

/// A classic ELB health check.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClassicHealthCheck {
    /// `TCP:30080`, `HTTP:32000/healthz`, ...
    pub target: String,
    /// Seconds between checks.
    pub interval: u32,
    /// Seconds to wait for a check.
    pub timeout: u32,
    /// Checks to become healthy.
    pub healthy_threshold: u32,
    /// Checks to become unhealthy.
    pub unhealthy_threshold: u32,
}

/// A classic ELB as described.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClassicElb {
    /// Name.
    pub name: String,
    /// DNS name (the Service's ingress hostname).
    pub dns_name: String,
    /// `internet-facing` or `internal`.
    pub scheme: String,
    /// VPC.
    pub vpc_id: String,
    /// Subnets.
    pub subnets: Vec<String>,
    /// Security groups.
    pub security_groups: Vec<String>,
    /// Registered instances.
    pub instances: Vec<String>,
    /// Listeners with their policy names.
    pub listeners: Vec<(ClassicListener, Vec<String>)>,
    /// Backend (instance port) policies.
    pub backend_policies: BTreeMap<u16, Vec<String>>,
    /// Names of the load balancer's other policies (proxy protocol, SSL negotiation).
    pub policies: Vec<String>,
    /// The health check.
    pub health_check: Option<ClassicHealthCheck>,
}

/// The attributes the AWS CCM sets on a classic ELB.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClassicAttributes {
    /// Cross-zone load balancing.
    pub cross_zone: bool,
    /// Access log enabled.
    pub access_log: bool,
    /// Access log bucket.
    pub access_log_bucket: Option<String>,
    /// Access log prefix.
    pub access_log_prefix: Option<String>,
    /// Access log emit interval (minutes: 5 or 60).
    pub access_log_interval: Option<u32>,
    /// Connection draining enabled.
    pub draining: bool,
    /// Connection draining timeout (seconds).
    pub draining_timeout: Option<u32>,
    /// Idle timeout (seconds).
    pub idle_timeout: u32,
}

/// A classic ELB to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewClassicElb {
    /// Name (32 characters at most).
    pub name: String,
    /// Internal instead of internet-facing.
    pub internal: bool,
    /// Subnets.
    pub subnets: Vec<String>,
    /// Security groups.
    pub security_groups: Vec<String>,
    /// Listeners.
    pub listeners: Vec<ClassicListener>,
}

const ELB: &str = "elb";

fn members(n: Node<'_, '_>, name: &str) -> Vec<String> {
    list(n, name)
        .filter_map(|m| m.text().map(|t| t.trim().to_string()))
        .filter(|t| !t.is_empty())
        .collect()
}

fn parse_listener(n: Node<'_, '_>) -> ClassicListener {
    ClassicListener {
        port: number(n, "LoadBalancerPort").unwrap_or_default(),
        protocol: string(n, "Protocol").unwrap_or_default(),
        instance_port: number(n, "InstancePort").unwrap_or_default(),
        instance_protocol: string(n, "InstanceProtocol").unwrap_or_default(),
        certificate: string(n, "SSLCertificateId"),
    }
}

fn parse_elb(n: Node<'_, '_>) -> ClassicElb {
    ClassicElb {
        name: string(n, "LoadBalancerName").unwrap_or_default(),
        dns_name: string(n, "DNSName").unwrap_or_default(),
        scheme: string(n, "Scheme").unwrap_or_default(),
        vpc_id: string(n, "VPCId").unwrap_or_default(),
        subnets: members(n, "Subnets"),
        security_groups: members(n, "SecurityGroups"),
        instances: list(n, "Instances")
            .filter_map(|i| string(i, "InstanceId"))
            .collect(),
        listeners: list(n, "ListenerDescriptions")
            .filter_map(|d| {
                let l = child(d, "Listener")?;
                Some((parse_listener(l), members(d, "PolicyNames")))
            })
            .collect(),
        backend_policies: list(n, "BackendServerDescriptions")
            .filter_map(|b| Some((number(b, "InstancePort")?, members(b, "PolicyNames"))))
            .collect(),
        policies: child(n, "Policies")
            .map(|p| members(p, "OtherPolicies"))
            .unwrap_or_default(),
        health_check: child(n, "HealthCheck").map(|h| ClassicHealthCheck {
            target: string(h, "Target").unwrap_or_default(),
            interval: number(h, "Interval").unwrap_or_default(),
            timeout: number(h, "Timeout").unwrap_or_default(),
            healthy_threshold: number(h, "HealthyThreshold").unwrap_or_default(),
            unhealthy_threshold: number(h, "UnhealthyThreshold").unwrap_or_default(),
        }),
    }
}

fn listener_params(p: &mut Params, listeners: &[ClassicListener]) {
    for (i, l) in listeners.iter().enumerate() {
        let k = format!("Listeners.member.{}", i + 1);
        p.set(format!("{k}.Protocol"), l.protocol.as_str())
            .set(format!("{k}.LoadBalancerPort"), l.port.to_string())
            .set(
                format!("{k}.InstanceProtocol"),
                l.instance_protocol.as_str(),
            )
            .set(format!("{k}.InstancePort"), l.instance_port.to_string());
        if let Some(c) = &l.certificate {
            p.set(format!("{k}.SSLCertificateId"), c.as_str());
        }
    }
}

fn flag(v: bool) -> &'static str {
    if v {
        "true"
    } else {
        "false"
    }
}

impl AwsClient {
    async fn classic_call(&self, action: &str, params: &Params) -> Result<String, AwsError> {
        let endpoint = self.elb.clone();
        self.call(&endpoint, action, params).await
    }

    /// DescribeLoadBalancers by name; `None` when there is none.
    pub async fn describe_classic(&self, name: &str) -> Result<Option<ClassicElb>, AwsError> {
        let mut p = Params::new();
        p.member_list("LoadBalancerNames", &[name]);
        let body = match self.classic_call("DescribeLoadBalancers", &p).await {
            Ok(b) => b,
            Err(e) if e.code() == "LoadBalancerNotFound" => return Ok(None),
            Err(e) => return Err(e),
        };
        let doc = parse(ELB, "DescribeLoadBalancers", &body)?;
        let found = list(result(&doc), "LoadBalancerDescriptions")
            .map(parse_elb)
            .find(|lb| lb.name == name);
        Ok(found)
    }

    /// CreateLoadBalancer; returns the DNS name.
    pub async fn create_classic(
        &self,
        lb: &NewClassicElb,
        tags: &BTreeMap<String, String>,
    ) -> Result<String, AwsError> {
        let mut p = Params::new();
        p.set("LoadBalancerName", lb.name.as_str());
        listener_params(&mut p, &lb.listeners);
        p.member_list("Subnets", &lb.subnets)
            .member_list("SecurityGroups", &lb.security_groups);
        if lb.internal {
            p.set("Scheme", "internal");
        }
        p.member_tags("Tags", tags);
        let body = self.classic_call("CreateLoadBalancer", &p).await?;
        let doc = parse(ELB, "CreateLoadBalancer", &body)?;
        Ok(string(result(&doc), "DNSName").unwrap_or_default())
    }

    /// DeleteLoadBalancer (absent: Ok, as AWS answers).
    pub async fn delete_classic(&self, name: &str) -> Result<(), AwsError> {
        let mut p = Params::new();
        p.set("LoadBalancerName", name);
        match self.classic_call("DeleteLoadBalancer", &p).await {
            Err(e) if e.code() != "LoadBalancerNotFound" => Err(e),
            _ => Ok(()),
        }
    }

    /// CreateLoadBalancerListeners.
    pub async fn create_classic_listeners(
        &self,
        name: &str,
        listeners: &[ClassicListener],
    ) -> Result<(), AwsError> {
        if listeners.is_empty() {
            return Ok(());
        }
        let mut p = Params::new();
        p.set("LoadBalancerName", name);
        listener_params(&mut p, listeners);
        self.classic_call("CreateLoadBalancerListeners", &p)
            .await
            .map(drop)
    }

    /// DeleteLoadBalancerListeners of these frontend ports.
    pub async fn delete_classic_listeners(
        &self,
        name: &str,
        ports: &[u16],
    ) -> Result<(), AwsError> {
        if ports.is_empty() {
            return Ok(());
        }
        let mut p = Params::new();
        p.set("LoadBalancerName", name);
        let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
        p.member_list("LoadBalancerPorts", &ports);
        self.classic_call("DeleteLoadBalancerListeners", &p)
            .await
            .map(drop)
    }

    /// ConfigureHealthCheck.
    pub async fn configure_classic_health_check(
        &self,
        name: &str,
        hc: &ClassicHealthCheck,
    ) -> Result<(), AwsError> {
        let mut p = Params::new();
        p.set("LoadBalancerName", name)
            .set("HealthCheck.Target", hc.target.as_str())
            .set("HealthCheck.Interval", hc.interval.to_string())
            .set("HealthCheck.Timeout", hc.timeout.to_string())
            .set(
                "HealthCheck.HealthyThreshold",
                hc.healthy_threshold.to_string(),
            )
            .set(
                "HealthCheck.UnhealthyThreshold",
                hc.unhealthy_threshold.to_string(),
            );
        self.classic_call("ConfigureHealthCheck", &p)
            .await
            .map(drop)
    }

    async fn classic_instances(
        &self,
        action: &str,
        name: &str,
        ids: &[String],
    ) -> Result<(), AwsError> {
        for chunk in ids.chunks(INSTANCES_PER_CALL) {
            let mut p = Params::new();
            p.set("LoadBalancerName", name);
            for (i, id) in chunk.iter().enumerate() {
                p.set(
                    format!("Instances.member.{}.InstanceId", i + 1),
                    id.as_str(),
                );
            }
            self.classic_call(action, &p).await?;
        }
        Ok(())
    }

    /// RegisterInstancesWithLoadBalancer (100 per call).
    pub async fn register_classic_instances(
        &self,
        name: &str,
        ids: &[String],
    ) -> Result<(), AwsError> {
        self.classic_instances("RegisterInstancesWithLoadBalancer", name, ids)
            .await
    }

    /// DeregisterInstancesFromLoadBalancer (100 per call).
    pub async fn deregister_classic_instances(
        &self,
        name: &str,
        ids: &[String],
    ) -> Result<(), AwsError> {
        self.classic_instances("DeregisterInstancesFromLoadBalancer", name, ids)
            .await
    }

    /// DescribeLoadBalancerAttributes.
    pub async fn classic_attributes(&self, name: &str) -> Result<ClassicAttributes, AwsError> {
        let mut p = Params::new();
        p.set("LoadBalancerName", name);
        let body = self
            .classic_call("DescribeLoadBalancerAttributes", &p)
            .await?;
        let doc = parse(ELB, "DescribeLoadBalancerAttributes", &body)?;
        let r = result(&doc);
        let a = child(r, "LoadBalancerAttributes").unwrap_or(r);
        let enabled = |n: &str| {
            child(a, n)
                .and_then(|c| string(c, "Enabled"))
                .is_some_and(|v| v.eq_ignore_ascii_case("true"))
        };
        let log = child(a, "AccessLog");
        Ok(ClassicAttributes {
            cross_zone: enabled("CrossZoneLoadBalancing"),
            access_log: enabled("AccessLog"),
            access_log_bucket: log.and_then(|l| string(l, "S3BucketName")),
            access_log_prefix: log.and_then(|l| string(l, "S3BucketPrefix")),
            access_log_interval: log.and_then(|l| number(l, "EmitInterval")),
            draining: enabled("ConnectionDraining"),
            draining_timeout: child(a, "ConnectionDraining").and_then(|c| number(c, "Timeout")),
            idle_timeout: child(a, "ConnectionSettings")
                .and_then(|c| number(c, "IdleTimeout"))
                .unwrap_or(60),
        })
    }

    /// ModifyLoadBalancerAttributes with the whole set.
    pub async fn modify_classic_attributes(
        &self,
        name: &str,
        a: &ClassicAttributes,
    ) -> Result<(), AwsError> {
        let k = "LoadBalancerAttributes";
        let mut p = Params::new();
        p.set("LoadBalancerName", name)
            .set(
                format!("{k}.CrossZoneLoadBalancing.Enabled"),
                flag(a.cross_zone),
            )
            .set(format!("{k}.AccessLog.Enabled"), flag(a.access_log))
            .set(format!("{k}.ConnectionDraining.Enabled"), flag(a.draining))
            .set(
                format!("{k}.ConnectionSettings.IdleTimeout"),
                a.idle_timeout.to_string(),
            );
        if let Some(b) = &a.access_log_bucket {
            p.set(format!("{k}.AccessLog.S3BucketName"), b.as_str());
        }
        if let Some(b) = &a.access_log_prefix {
            p.set(format!("{k}.AccessLog.S3BucketPrefix"), b.as_str());
        }
        if let Some(i) = a.access_log_interval {
            p.set(format!("{k}.AccessLog.EmitInterval"), i.to_string());
        }
        if let Some(t) = a.draining_timeout {
            p.set(format!("{k}.ConnectionDraining.Timeout"), t.to_string());
        }
        self.classic_call("ModifyLoadBalancerAttributes", &p)
            .await
            .map(drop)
    }

    /// CreateLoadBalancerPolicy.
    pub async fn create_classic_policy(
        &self,
        name: &str,
        policy: &str,
        policy_type: &str,
        attributes: &[(&str, &str)],
    ) -> Result<(), AwsError> {
        let mut p = Params::new();
        p.set("LoadBalancerName", name)
            .set("PolicyName", policy)
            .set("PolicyTypeName", policy_type);
        for (i, (k, v)) in attributes.iter().enumerate() {
            p.set(
                format!("PolicyAttributes.member.{}.AttributeName", i + 1),
                *k,
            );
            p.set(
                format!("PolicyAttributes.member.{}.AttributeValue", i + 1),
                *v,
            );
        }
        self.classic_call("CreateLoadBalancerPolicy", &p)
            .await
            .map(drop)
    }

    /// SetLoadBalancerPoliciesForBackendServer (an empty list removes them).
    pub async fn set_classic_backend_policies(
        &self,
        name: &str,
        instance_port: u16,
        policies: &[String],
    ) -> Result<(), AwsError> {
        let mut p = Params::new();
        p.set("LoadBalancerName", name)
            .set("InstancePort", instance_port.to_string());
        if policies.is_empty() {
            p.set("PolicyNames", "");
        } else {
            p.member_list("PolicyNames", policies);
        }
        self.classic_call("SetLoadBalancerPoliciesForBackendServer", &p)
            .await
            .map(drop)
    }

    /// SetLoadBalancerPoliciesOfListener.
    pub async fn set_classic_listener_policies(
        &self,
        name: &str,
        port: u16,
        policies: &[String],
    ) -> Result<(), AwsError> {
        let mut p = Params::new();
        p.set("LoadBalancerName", name)
            .set("LoadBalancerPort", port.to_string());
        if policies.is_empty() {
            p.set("PolicyNames", "");
        } else {
            p.member_list("PolicyNames", policies);
        }
        self.classic_call("SetLoadBalancerPoliciesOfListener", &p)
            .await
            .map(drop)
    }

    /// ApplySecurityGroupsToLoadBalancer.
    pub async fn apply_classic_security_groups(
        &self,
        name: &str,
        groups: &[String],
    ) -> Result<(), AwsError> {
        let mut p = Params::new();
        p.set("LoadBalancerName", name)
            .member_list("SecurityGroups", groups);
        self.classic_call("ApplySecurityGroupsToLoadBalancer", &p)
            .await
            .map(drop)
    }

    /// AttachLoadBalancerToSubnets / DetachLoadBalancerFromSubnets.
    pub async fn classic_subnets(
        &self,
        name: &str,
        attach: bool,
        subnets: &[String],
    ) -> Result<(), AwsError> {
        if subnets.is_empty() {
            return Ok(());
        }
        let mut p = Params::new();
        p.set("LoadBalancerName", name)
            .member_list("Subnets", subnets);
        let action = if attach {
            "AttachLoadBalancerToSubnets"
        } else {
            "DetachLoadBalancerFromSubnets"
        };
        self.classic_call(action, &p).await.map(drop)
    }

    /// DescribeTags of classic ELBs by name (20 per call).
    pub async fn classic_tags(
        &self,
        names: &[String],
    ) -> Result<BTreeMap<String, BTreeMap<String, String>>, AwsError> {
        let mut out = BTreeMap::new();
        for chunk in names.chunks(TAGS_PER_CALL) {
            let mut p = Params::new();
            p.member_list("LoadBalancerNames", chunk);
            let body = self.classic_call("DescribeTags", &p).await?;
            let doc = parse(ELB, "DescribeTags", &body)?;
            for d in list(result(&doc), "TagDescriptions") {
                if let Some(n) = string(d, "LoadBalancerName") {
                    out.insert(n, tags(d, "Tags"));
                }
            }
        }
        Ok(out)
    }

    /// AddTags to a classic ELB.
    pub async fn add_classic_tags(
        &self,
        name: &str,
        tags: &BTreeMap<String, String>,
    ) -> Result<(), AwsError> {
        if tags.is_empty() {
            return Ok(());
        }
        let mut p = Params::new();
        p.member_list("LoadBalancerNames", &[name])
            .member_tags("Tags", tags);
        self.classic_call("AddTags", &p).await.map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_classic_elb_parses() {
        let xml = r#"<DescribeLoadBalancersResponse xmlns="http://elasticloadbalancing.amazonaws.com/doc/2012-06-01/"><DescribeLoadBalancersResult><LoadBalancerDescriptions><member>
<LoadBalancerName>a1</LoadBalancerName><DNSName>a1-1.us-east-1.elb.amazonaws.com</DNSName><Scheme>internet-facing</Scheme><VPCId>vpc-1</VPCId>
<Subnets><member>subnet-1</member><member>subnet-2</member></Subnets><SecurityGroups><member>sg-1</member></SecurityGroups>
<Instances><member><InstanceId>i-1</InstanceId></member></Instances>
<ListenerDescriptions><member><Listener><Protocol>SSL</Protocol><LoadBalancerPort>443</LoadBalancerPort><InstanceProtocol>TCP</InstanceProtocol><InstancePort>30443</InstancePort><SSLCertificateId>arn:c</SSLCertificateId></Listener>
<PolicyNames><member>k8s-SSLNegotiationPolicy-x</member></PolicyNames></member></ListenerDescriptions>
<BackendServerDescriptions><member><InstancePort>30443</InstancePort><PolicyNames><member>k8s-proxyprotocol-enabled</member></PolicyNames></member></BackendServerDescriptions>
<Policies><OtherPolicies><member>k8s-proxyprotocol-enabled</member></OtherPolicies></Policies>
<HealthCheck><Target>TCP:30443</Target><Interval>10</Interval><Timeout>5</Timeout><UnhealthyThreshold>6</UnhealthyThreshold><HealthyThreshold>2</HealthyThreshold></HealthCheck>
</member></LoadBalancerDescriptions></DescribeLoadBalancersResult></DescribeLoadBalancersResponse>"#;
        let doc = roxmltree::Document::parse(xml).unwrap();
        let lb = list(result(&doc), "LoadBalancerDescriptions")
            .map(parse_elb)
            .next()
            .unwrap();
        assert_eq!(lb.name, "a1");
        assert_eq!(lb.subnets, vec!["subnet-1", "subnet-2"]);
        assert_eq!(lb.instances, vec!["i-1"]);
        assert_eq!(lb.listeners[0].0.instance_port, 30443);
        assert_eq!(lb.listeners[0].0.certificate.as_deref(), Some("arn:c"));
        assert_eq!(lb.listeners[0].1, vec!["k8s-SSLNegotiationPolicy-x"]);
        assert_eq!(
            lb.backend_policies[&30443],
            vec!["k8s-proxyprotocol-enabled"]
        );
        assert_eq!(lb.policies, vec!["k8s-proxyprotocol-enabled"]);
        assert_eq!(lb.health_check.unwrap().unhealthy_threshold, 6);
        let same = ClassicListener {
            protocol: "ssl".into(),
            instance_protocol: "tcp".into(),
            certificate: Some("ARN:C".into()),
            ..lb.listeners[0].0.clone()
        };
        assert!(same.same_as(&lb.listeners[0].0));
    }
}
