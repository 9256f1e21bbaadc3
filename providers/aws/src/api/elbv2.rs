//! The ELBv2 calls for network load balancers: load balancers, target groups, targets,
//! listeners, attributes and tags.

use std::collections::BTreeMap;

use roxmltree::Node;

use super::xml::{child, list, number, result, string, tags};
use super::{parse, AwsClient, AwsError, Params};

/// Resources per DescribeTags call (the API's limit).
const TAGS_PER_CALL: usize = 20;
/// Targets per Register/DeregisterTargets call.
const TARGETS_PER_CALL: usize = 500;

/// A load balancer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadBalancer {
    /// ARN.
    pub arn: String,
    /// Name.
    pub name: String,
    /// DNS name (the Service's ingress hostname).
    pub dns_name: String,
    /// `internet-facing` or `internal`.
    pub scheme: String,
    /// VPC.
    pub vpc_id: String,
    /// `provisioning`, `active`, `failed`, ...
    pub state: String,
    /// `network`, `application`, `gateway`.
    pub lb_type: String,
    /// `(zone, subnet)` per availability zone.
    pub zones: Vec<(String, String)>,
}

/// A target group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TargetGroup {
    /// ARN.
    pub arn: String,
    /// Name.
    pub name: String,
    /// `TCP`, `UDP`, `TCP_UDP`, `TLS`.
    pub protocol: String,
    /// The traffic port (the NodePort).
    pub port: u16,
    /// Health check protocol.
    pub hc_protocol: String,
    /// Health check port (`traffic-port` or a number).
    pub hc_port: String,
    /// Health check path (HTTP/HTTPS checks).
    pub hc_path: Option<String>,
    /// Seconds between checks.
    pub hc_interval: Option<u32>,
    /// Seconds to wait for a check.
    pub hc_timeout: Option<u32>,
    /// Checks to become healthy.
    pub healthy_threshold: Option<u32>,
    /// Checks to become unhealthy.
    pub unhealthy_threshold: Option<u32>,
    /// Load balancers that forward to it.
    pub lb_arns: Vec<String>,
}

/// A listener.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listener {
    /// ARN.
    pub arn: String,
    /// Frontend port.
    pub port: u16,
    /// `TCP`, `UDP`, `TCP_UDP`, `TLS`.
    pub protocol: String,
    /// The target group of its forward action.
    pub target_group_arn: Option<String>,
    /// Certificate ARN (TLS).
    pub certificate: Option<String>,
    /// SSL policy (TLS).
    pub ssl_policy: Option<String>,
}

/// A registered target.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Target {
    /// Instance ID.
    pub id: String,
    /// Port.
    pub port: u16,
}

/// A health check, as created or modified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    /// `TCP`, `HTTP`, `HTTPS`.
    pub protocol: String,
    /// `traffic-port` or a port number.
    pub port: String,
    /// Path for HTTP/HTTPS.
    pub path: Option<String>,
    /// Seconds between checks.
    pub interval: u32,
    /// Seconds to wait for a check.
    pub timeout: u32,
    /// Checks to become healthy.
    pub healthy_threshold: u32,
    /// Checks to become unhealthy.
    pub unhealthy_threshold: u32,
}

/// A target group to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTargetGroup {
    /// Name (32 characters at most).
    pub name: String,
    /// `TCP`, `UDP`, `TCP_UDP`, `TLS`.
    pub protocol: String,
    /// The NodePort.
    pub port: u16,
    /// VPC.
    pub vpc_id: String,
    /// Health check.
    pub health_check: HealthCheck,
}

/// A load balancer to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewLoadBalancer {
    /// Name (32 characters at most).
    pub name: String,
    /// Internal instead of internet-facing.
    pub internal: bool,
    /// Subnets, one per zone.
    pub subnets: Vec<String>,
    /// EIP allocation per subnet (internet-facing only).
    pub allocations: Vec<String>,
    /// Private IPv4 address per subnet (internal only).
    pub private_ips: Vec<String>,
    /// `ipv4` or `dualstack`.
    pub ip_address_type: Option<String>,
}

const ELB: &str = "elasticloadbalancing";

fn parse_lb(n: Node<'_, '_>) -> LoadBalancer {
    LoadBalancer {
        arn: string(n, "LoadBalancerArn").unwrap_or_default(),
        name: string(n, "LoadBalancerName").unwrap_or_default(),
        dns_name: string(n, "DNSName").unwrap_or_default(),
        scheme: string(n, "Scheme").unwrap_or_default(),
        vpc_id: string(n, "VpcId").unwrap_or_default(),
        state: child(n, "State")
            .and_then(|s| string(s, "Code"))
            .unwrap_or_default(),
        lb_type: string(n, "Type").unwrap_or_default(),
        zones: list(n, "AvailabilityZones")
            .map(|z| {
                (
                    string(z, "ZoneName").unwrap_or_default(),
                    string(z, "SubnetId").unwrap_or_default(),
                )
            })
            .collect(),
    }
}

fn parse_tg(n: Node<'_, '_>) -> TargetGroup {
    TargetGroup {
        arn: string(n, "TargetGroupArn").unwrap_or_default(),
        name: string(n, "TargetGroupName").unwrap_or_default(),
        protocol: string(n, "Protocol").unwrap_or_default(),
        port: number(n, "Port").unwrap_or_default(),
        hc_protocol: string(n, "HealthCheckProtocol").unwrap_or_default(),
        hc_port: string(n, "HealthCheckPort").unwrap_or_default(),
        hc_path: string(n, "HealthCheckPath"),
        hc_interval: number(n, "HealthCheckIntervalSeconds"),
        hc_timeout: number(n, "HealthCheckTimeoutSeconds"),
        healthy_threshold: number(n, "HealthyThresholdCount"),
        unhealthy_threshold: number(n, "UnhealthyThresholdCount"),
        lb_arns: list(n, "LoadBalancerArns")
            .filter_map(|m| m.text().map(|t| t.trim().to_string()))
            .collect(),
    }
}

fn parse_listener(n: Node<'_, '_>) -> Listener {
    Listener {
        arn: string(n, "ListenerArn").unwrap_or_default(),
        port: number(n, "Port").unwrap_or_default(),
        protocol: string(n, "Protocol").unwrap_or_default(),
        target_group_arn: list(n, "DefaultActions").find_map(|a| string(a, "TargetGroupArn")),
        certificate: list(n, "Certificates").find_map(|c| string(c, "CertificateArn")),
        ssl_policy: string(n, "SslPolicy"),
    }
}

fn health_check_params(p: &mut Params, hc: &HealthCheck) {
    p.set("HealthCheckProtocol", hc.protocol.as_str())
        .set("HealthCheckPort", hc.port.as_str())
        .set("HealthCheckIntervalSeconds", hc.interval.to_string())
        .set("HealthCheckTimeoutSeconds", hc.timeout.to_string())
        .set("HealthyThresholdCount", hc.healthy_threshold.to_string())
        .set(
            "UnhealthyThresholdCount",
            hc.unhealthy_threshold.to_string(),
        );
    if let Some(path) = &hc.path {
        p.set("HealthCheckPath", path.as_str());
    }
}

fn targets_params(p: &mut Params, targets: &[Target]) {
    for (i, t) in targets.iter().enumerate() {
        p.set(format!("Targets.member.{}.Id", i + 1), t.id.as_str());
        p.set(format!("Targets.member.{}.Port", i + 1), t.port.to_string());
    }
}

impl AwsClient {
    async fn elb_call(&self, action: &str, params: &Params) -> Result<String, AwsError> {
        let endpoint = self.elbv2.clone();
        self.call(&endpoint, action, params).await
    }

    /// DescribeLoadBalancers by name; `None` when there is none.
    pub async fn describe_load_balancer(
        &self,
        name: &str,
    ) -> Result<Option<LoadBalancer>, AwsError> {
        let mut p = Params::new();
        p.member_list("Names", &[name]);
        let body = match self.elb_call("DescribeLoadBalancers", &p).await {
            Ok(b) => b,
            Err(e) if e.code() == "LoadBalancerNotFound" => return Ok(None),
            Err(e) => return Err(e),
        };
        let doc = parse(ELB, "DescribeLoadBalancers", &body)?;
        let found = list(result(&doc), "LoadBalancers")
            .map(parse_lb)
            .find(|lb| lb.name == name);
        Ok(found)
    }

    /// CreateLoadBalancer of type network.
    pub async fn create_load_balancer(
        &self,
        lb: &NewLoadBalancer,
        tags: &BTreeMap<String, String>,
    ) -> Result<LoadBalancer, AwsError> {
        let mut p = Params::new();
        p.set("Name", lb.name.as_str()).set("Type", "network").set(
            "Scheme",
            if lb.internal {
                "internal"
            } else {
                "internet-facing"
            },
        );
        if lb.allocations.is_empty() && lb.private_ips.is_empty() {
            p.member_list("Subnets", &lb.subnets);
        } else {
            for (i, s) in lb.subnets.iter().enumerate() {
                p.set(
                    format!("SubnetMappings.member.{}.SubnetId", i + 1),
                    s.as_str(),
                );
                if let Some(a) = lb.allocations.get(i) {
                    p.set(
                        format!("SubnetMappings.member.{}.AllocationId", i + 1),
                        a.as_str(),
                    );
                }
                if let Some(ip) = lb.private_ips.get(i) {
                    p.set(
                        format!("SubnetMappings.member.{}.PrivateIPv4Address", i + 1),
                        ip.as_str(),
                    );
                }
            }
        }
        if let Some(t) = &lb.ip_address_type {
            p.set("IpAddressType", t.as_str());
        }
        p.member_tags("Tags", tags);
        let body = self.elb_call("CreateLoadBalancer", &p).await?;
        let doc = parse(ELB, "CreateLoadBalancer", &body)?;
        let first = list(result(&doc), "LoadBalancers").map(parse_lb).next();
        first.ok_or_else(|| malformed("CreateLoadBalancer", "no load balancer in the answer"))
    }

    /// DeleteLoadBalancer (absent: Ok).
    pub async fn delete_load_balancer(&self, arn: &str) -> Result<(), AwsError> {
        let mut p = Params::new();
        p.set("LoadBalancerArn", arn);
        match self.elb_call("DeleteLoadBalancer", &p).await {
            Ok(_) => Ok(()),
            Err(e) if e.code() == "LoadBalancerNotFound" => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// SetIpAddressType (`ipv4` / `dualstack`).
    pub async fn set_ip_address_type(
        &self,
        arn: &str,
        ip_address_type: &str,
    ) -> Result<(), AwsError> {
        let mut p = Params::new();
        p.set("LoadBalancerArn", arn)
            .set("IpAddressType", ip_address_type);
        self.elb_call("SetIpAddressType", &p).await.map(drop)
    }

    /// DescribeTags of several resources (any number; 20 per call).
    pub async fn describe_tags(
        &self,
        arns: &[String],
    ) -> Result<BTreeMap<String, BTreeMap<String, String>>, AwsError> {
        let mut out = BTreeMap::new();
        for chunk in arns.chunks(TAGS_PER_CALL) {
            let mut p = Params::new();
            p.member_list("ResourceArns", chunk);
            let body = self.elb_call("DescribeTags", &p).await?;
            let doc = parse(ELB, "DescribeTags", &body)?;
            for d in list(result(&doc), "TagDescriptions") {
                if let Some(arn) = string(d, "ResourceArn") {
                    out.insert(arn, tags(d, "Tags"));
                }
            }
        }
        Ok(out)
    }

    /// DescribeLoadBalancerAttributes.
    pub async fn load_balancer_attributes(
        &self,
        arn: &str,
    ) -> Result<BTreeMap<String, String>, AwsError> {
        let mut p = Params::new();
        p.set("LoadBalancerArn", arn);
        let body = self.elb_call("DescribeLoadBalancerAttributes", &p).await?;
        let doc = parse(ELB, "DescribeLoadBalancerAttributes", &body)?;
        Ok(attributes(result(&doc)))
    }

    /// ModifyLoadBalancerAttributes.
    pub async fn modify_load_balancer_attributes(
        &self,
        arn: &str,
        attrs: &BTreeMap<String, String>,
    ) -> Result<(), AwsError> {
        let mut p = Params::new();
        p.set("LoadBalancerArn", arn);
        attribute_params(&mut p, attrs);
        self.elb_call("ModifyLoadBalancerAttributes", &p)
            .await
            .map(drop)
    }

    /// DescribeTargetGroups of a load balancer.
    pub async fn target_groups_of(&self, lb_arn: &str) -> Result<Vec<TargetGroup>, AwsError> {
        let mut p = Params::new();
        p.set("LoadBalancerArn", lb_arn);
        match self.elb_call("DescribeTargetGroups", &p).await {
            Ok(body) => {
                let doc = parse(ELB, "DescribeTargetGroups", &body)?;
                Ok(list(result(&doc), "TargetGroups").map(parse_tg).collect())
            }
            Err(e) if e.code() == "LoadBalancerNotFound" || e.code() == "TargetGroupNotFound" => {
                Ok(Vec::new())
            }
            Err(e) => Err(e),
        }
    }

    /// DescribeTargetGroups by ARN (those that exist; at most 20 per call).
    pub async fn target_groups_by_arn(
        &self,
        arns: &[String],
    ) -> Result<Vec<TargetGroup>, AwsError> {
        let mut out = Vec::new();
        for chunk in arns.chunks(20) {
            let mut p = Params::new();
            p.member_list("TargetGroupArns", chunk);
            match self.elb_call("DescribeTargetGroups", &p).await {
                Ok(body) => {
                    let doc = parse(ELB, "DescribeTargetGroups", &body)?;
                    out.extend(list(result(&doc), "TargetGroups").map(parse_tg));
                }
                // One unknown ARN fails the whole call: ask one by one.
                Err(e) if e.code() == "TargetGroupNotFound" && chunk.len() > 1 => {
                    for arn in chunk {
                        out.extend(
                            Box::pin(self.target_groups_by_arn(std::slice::from_ref(arn))).await?,
                        );
                    }
                }
                Err(e) if e.code() == "TargetGroupNotFound" => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Every target group of the account and region (pages of 400).
    pub async fn all_target_groups(&self) -> Result<Vec<TargetGroup>, AwsError> {
        let mut out = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            let mut p = Params::new();
            p.set("PageSize", "400");
            if let Some(m) = &marker {
                p.set("Marker", m.as_str());
            }
            let body = self.elb_call("DescribeTargetGroups", &p).await?;
            let doc = parse(ELB, "DescribeTargetGroups", &body)?;
            let r = result(&doc);
            out.extend(list(r, "TargetGroups").map(parse_tg));
            marker = string(r, "NextMarker");
            if marker.is_none() {
                return Ok(out);
            }
        }
    }

    /// DescribeTargetGroups by name; `None` when there is none.
    pub async fn target_group_named(&self, name: &str) -> Result<Option<TargetGroup>, AwsError> {
        let mut p = Params::new();
        p.member_list("Names", &[name]);
        match self.elb_call("DescribeTargetGroups", &p).await {
            Ok(body) => {
                let doc = parse(ELB, "DescribeTargetGroups", &body)?;
                let found = list(result(&doc), "TargetGroups")
                    .map(parse_tg)
                    .find(|t| t.name == name);
                Ok(found)
            }
            Err(e) if e.code() == "TargetGroupNotFound" => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// CreateTargetGroup with instance targets.
    pub async fn create_target_group(
        &self,
        tg: &NewTargetGroup,
        tags: &BTreeMap<String, String>,
    ) -> Result<TargetGroup, AwsError> {
        let mut p = Params::new();
        p.set("Name", tg.name.as_str())
            .set("Protocol", tg.protocol.as_str())
            .set("Port", tg.port.to_string())
            .set("VpcId", tg.vpc_id.as_str())
            .set("TargetType", "instance");
        health_check_params(&mut p, &tg.health_check);
        p.member_tags("Tags", tags);
        let body = self.elb_call("CreateTargetGroup", &p).await?;
        let doc = parse(ELB, "CreateTargetGroup", &body)?;
        let first = list(result(&doc), "TargetGroups").map(parse_tg).next();
        first.ok_or_else(|| malformed("CreateTargetGroup", "no target group in the answer"))
    }

    /// ModifyTargetGroup's health check.
    pub async fn modify_target_group(&self, arn: &str, hc: &HealthCheck) -> Result<(), AwsError> {
        let mut p = Params::new();
        p.set("TargetGroupArn", arn);
        health_check_params(&mut p, hc);
        self.elb_call("ModifyTargetGroup", &p).await.map(drop)
    }

    /// DeleteTargetGroup (absent: Ok).
    pub async fn delete_target_group(&self, arn: &str) -> Result<(), AwsError> {
        let mut p = Params::new();
        p.set("TargetGroupArn", arn);
        match self.elb_call("DeleteTargetGroup", &p).await {
            Ok(_) => Ok(()),
            Err(e) if e.code() == "TargetGroupNotFound" => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// DescribeTargetGroupAttributes.
    pub async fn target_group_attributes(
        &self,
        arn: &str,
    ) -> Result<BTreeMap<String, String>, AwsError> {
        let mut p = Params::new();
        p.set("TargetGroupArn", arn);
        let body = self.elb_call("DescribeTargetGroupAttributes", &p).await?;
        let doc = parse(ELB, "DescribeTargetGroupAttributes", &body)?;
        Ok(attributes(result(&doc)))
    }

    /// ModifyTargetGroupAttributes.
    pub async fn modify_target_group_attributes(
        &self,
        arn: &str,
        attrs: &BTreeMap<String, String>,
    ) -> Result<(), AwsError> {
        let mut p = Params::new();
        p.set("TargetGroupArn", arn);
        attribute_params(&mut p, attrs);
        self.elb_call("ModifyTargetGroupAttributes", &p)
            .await
            .map(drop)
    }

    /// The registered targets of a target group (those being deregistered left out).
    pub async fn targets_of(&self, tg_arn: &str) -> Result<Vec<Target>, AwsError> {
        let mut p = Params::new();
        p.set("TargetGroupArn", tg_arn);
        let body = self.elb_call("DescribeTargetHealth", &p).await?;
        let doc = parse(ELB, "DescribeTargetHealth", &body)?;
        Ok(list(result(&doc), "TargetHealthDescriptions")
            .filter(|d| {
                child(*d, "TargetHealth")
                    .and_then(|h| string(h, "Reason"))
                    .is_none_or(|r| r != "Target.DeregistrationInProgress")
            })
            .filter_map(|d| {
                let t = child(d, "Target")?;
                Some(Target {
                    id: string(t, "Id")?,
                    port: number(t, "Port").unwrap_or_default(),
                })
            })
            .collect())
    }

    /// RegisterTargets (500 per call).
    pub async fn register_targets(&self, tg_arn: &str, targets: &[Target]) -> Result<(), AwsError> {
        for chunk in targets.chunks(TARGETS_PER_CALL) {
            let mut p = Params::new();
            p.set("TargetGroupArn", tg_arn);
            targets_params(&mut p, chunk);
            self.elb_call("RegisterTargets", &p).await?;
        }
        Ok(())
    }

    /// DeregisterTargets (500 per call).
    pub async fn deregister_targets(
        &self,
        tg_arn: &str,
        targets: &[Target],
    ) -> Result<(), AwsError> {
        for chunk in targets.chunks(TARGETS_PER_CALL) {
            let mut p = Params::new();
            p.set("TargetGroupArn", tg_arn);
            targets_params(&mut p, chunk);
            self.elb_call("DeregisterTargets", &p).await?;
        }
        Ok(())
    }

    /// DescribeListeners of a load balancer.
    pub async fn listeners_of(&self, lb_arn: &str) -> Result<Vec<Listener>, AwsError> {
        let mut out = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            let mut p = Params::new();
            p.set("LoadBalancerArn", lb_arn);
            if let Some(m) = &marker {
                p.set("Marker", m.as_str());
            }
            let body = match self.elb_call("DescribeListeners", &p).await {
                Ok(b) => b,
                Err(e) if e.code() == "LoadBalancerNotFound" => return Ok(out),
                Err(e) => return Err(e),
            };
            let doc = parse(ELB, "DescribeListeners", &body)?;
            let r = result(&doc);
            out.extend(list(r, "Listeners").map(parse_listener));
            marker = string(r, "NextMarker");
            if marker.is_none() {
                return Ok(out);
            }
        }
    }

    /// CreateListener forwarding to `tg_arn`.
    #[allow(clippy::too_many_arguments)]
    pub async fn create_listener(
        &self,
        lb_arn: &str,
        port: u16,
        protocol: &str,
        tg_arn: &str,
        certificate: Option<&str>,
        ssl_policy: Option<&str>,
        tags: &BTreeMap<String, String>,
    ) -> Result<Listener, AwsError> {
        let mut p = Params::new();
        p.set("LoadBalancerArn", lb_arn)
            .set("Port", port.to_string())
            .set("Protocol", protocol)
            .set("DefaultActions.member.1.Type", "forward")
            .set("DefaultActions.member.1.TargetGroupArn", tg_arn);
        if let Some(c) = certificate {
            p.set("Certificates.member.1.CertificateArn", c);
        }
        if let Some(s) = ssl_policy {
            p.set("SslPolicy", s);
        }
        p.member_tags("Tags", tags);
        let body = self.elb_call("CreateListener", &p).await?;
        let doc = parse(ELB, "CreateListener", &body)?;
        let first = list(result(&doc), "Listeners").map(parse_listener).next();
        first.ok_or_else(|| malformed("CreateListener", "no listener in the answer"))
    }

    /// ModifyListener: protocol, certificate, policy and forward target.
    pub async fn modify_listener(
        &self,
        arn: &str,
        protocol: &str,
        tg_arn: &str,
        certificate: Option<&str>,
        ssl_policy: Option<&str>,
    ) -> Result<(), AwsError> {
        let mut p = Params::new();
        p.set("ListenerArn", arn)
            .set("Protocol", protocol)
            .set("DefaultActions.member.1.Type", "forward")
            .set("DefaultActions.member.1.TargetGroupArn", tg_arn);
        if let Some(c) = certificate {
            p.set("Certificates.member.1.CertificateArn", c);
        }
        if let Some(s) = ssl_policy {
            p.set("SslPolicy", s);
        }
        self.elb_call("ModifyListener", &p).await.map(drop)
    }

    /// DeleteListener (absent: Ok).
    pub async fn delete_listener(&self, arn: &str) -> Result<(), AwsError> {
        let mut p = Params::new();
        p.set("ListenerArn", arn);
        match self.elb_call("DeleteListener", &p).await {
            Ok(_) => Ok(()),
            Err(e) if e.code() == "ListenerNotFound" => Ok(()),
            Err(e) => Err(e),
        }
    }
}

fn attributes(n: Node<'_, '_>) -> BTreeMap<String, String> {
    list(n, "Attributes")
        .filter_map(|a| Some((string(a, "Key")?, string(a, "Value").unwrap_or_default())))
        .collect()
}

fn attribute_params(p: &mut Params, attrs: &BTreeMap<String, String>) {
    for (i, (k, v)) in attrs.iter().enumerate() {
        p.set(format!("Attributes.member.{}.Key", i + 1), k.as_str());
        p.set(format!("Attributes.member.{}.Value", i + 1), v.as_str());
    }
}

fn malformed(action: &str, why: &str) -> AwsError {
    AwsError {
        service: ELB,
        action: action.to_string(),
        status: Some(200),
        code: "MalformedResponse".into(),
        message: why.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_balancers_target_groups_and_listeners_parse() {
        let xml = r#"<DescribeLoadBalancersResponse xmlns="http://elasticloadbalancing.amazonaws.com/doc/2015-12-01/"><DescribeLoadBalancersResult><LoadBalancers><member>
<LoadBalancerArn>arn:aws:elasticloadbalancing:us-east-1:1:loadbalancer/net/a1/x</LoadBalancerArn><DNSName>a1-x.elb.us-east-1.amazonaws.com</DNSName>
<LoadBalancerName>a1</LoadBalancerName><Scheme>internal</Scheme><VpcId>vpc-1</VpcId><State><Code>active</Code></State><Type>network</Type>
<AvailabilityZones><member><ZoneName>us-east-1a</ZoneName><SubnetId>subnet-1</SubnetId></member></AvailabilityZones></member></LoadBalancers></DescribeLoadBalancersResult></DescribeLoadBalancersResponse>"#;
        let doc = roxmltree::Document::parse(xml).unwrap();
        let lb = list(result(&doc), "LoadBalancers")
            .map(parse_lb)
            .next()
            .unwrap();
        assert_eq!(lb.name, "a1");
        assert_eq!(lb.state, "active");
        assert_eq!(
            lb.zones,
            vec![("us-east-1a".to_string(), "subnet-1".to_string())]
        );

        let xml = r#"<R><DescribeTargetGroupsResult><TargetGroups><member><TargetGroupArn>tg1</TargetGroupArn><TargetGroupName>k8s-x</TargetGroupName>
<Protocol>TCP</Protocol><Port>30080</Port><HealthCheckProtocol>HTTP</HealthCheckProtocol><HealthCheckPort>32000</HealthCheckPort><HealthCheckPath>/healthz</HealthCheckPath>
<HealthCheckIntervalSeconds>10</HealthCheckIntervalSeconds><LoadBalancerArns><member>lb1</member></LoadBalancerArns></member></TargetGroups></DescribeTargetGroupsResult></R>"#;
        let doc = roxmltree::Document::parse(xml).unwrap();
        let tg = list(result(&doc), "TargetGroups")
            .map(parse_tg)
            .next()
            .unwrap();
        assert_eq!(tg.port, 30080);
        assert_eq!(tg.hc_path.as_deref(), Some("/healthz"));
        assert_eq!(tg.hc_interval, Some(10));
        assert_eq!(tg.lb_arns, vec!["lb1"]);

        let xml = r#"<R><X><Listeners><member><ListenerArn>l1</ListenerArn><Port>80</Port><Protocol>TCP</Protocol>
<DefaultActions><member><Type>forward</Type><TargetGroupArn>tg1</TargetGroupArn></member></DefaultActions></member></Listeners></X></R>"#;
        let doc = roxmltree::Document::parse(xml).unwrap();
        let root = doc.root_element();
        let l = list(child(root, "X").unwrap(), "Listeners")
            .map(parse_listener)
            .next()
            .unwrap();
        assert_eq!(l.port, 80);
        assert_eq!(l.target_group_arn.as_deref(), Some("tg1"));
    }
}
