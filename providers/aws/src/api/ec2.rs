//! The EC2 calls: instances, availability zones, subnets, route tables and routes.

use std::collections::BTreeMap;

use roxmltree::Node;

use super::xml::{boolean, child, list, number, string, tags};
use super::{parse, AwsClient, AwsError, Params};

/// Values per filter in one DescribeInstances call (AWS allows 200; the AWS CCM uses 150).
pub const FILTER_VALUES_PER_CALL: usize = 150;

/// One network interface of an instance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Interface {
    /// `attachment.deviceIndex`.
    pub device_index: Option<u32>,
    /// `in-use`, `available`, ...
    pub status: String,
    /// Private IPv4 addresses, primary first.
    pub private_ips: Vec<String>,
    /// IPv6 addresses.
    pub ipv6: Vec<String>,
}

/// The parts of an EC2 instance a CCM uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Instance {
    /// `i-...`.
    pub id: String,
    /// `pending`, `running`, `stopping`, `stopped`, `shutting-down`, `terminated`.
    pub state: String,
    /// e.g. `m5.large`.
    pub instance_type: String,
    /// Availability zone.
    pub zone: String,
    /// `privateDnsName`.
    pub private_dns: Option<String>,
    /// `dnsName` (public).
    pub public_dns: Option<String>,
    /// `privateIpAddress`.
    pub private_ip: Option<String>,
    /// `ipAddress` (public).
    pub public_ip: Option<String>,
    /// VPC.
    pub vpc_id: Option<String>,
    /// Subnet.
    pub subnet_id: Option<String>,
    /// Network interfaces.
    pub interfaces: Vec<Interface>,
    /// Security groups attached (`groupSet`).
    pub security_groups: Vec<String>,
    /// Tags.
    pub tags: BTreeMap<String, String>,
}

fn parse_instance(n: Node<'_, '_>) -> Instance {
    let placement = child(n, "placement");
    Instance {
        id: string(n, "instanceId").unwrap_or_default(),
        state: child(n, "instanceState")
            .and_then(|s| string(s, "name"))
            .unwrap_or_default(),
        instance_type: string(n, "instanceType").unwrap_or_default(),
        zone: placement
            .and_then(|p| string(p, "availabilityZone"))
            .unwrap_or_default(),
        private_dns: string(n, "privateDnsName"),
        public_dns: string(n, "dnsName"),
        private_ip: string(n, "privateIpAddress"),
        public_ip: string(n, "ipAddress"),
        vpc_id: string(n, "vpcId"),
        subnet_id: string(n, "subnetId"),
        interfaces: list(n, "networkInterfaceSet")
            .map(|i| Interface {
                device_index: child(i, "attachment").and_then(|a| number(a, "deviceIndex")),
                status: string(i, "status").unwrap_or_default(),
                private_ips: {
                    let mut ips: Vec<(bool, String)> = list(i, "privateIpAddressesSet")
                        .filter_map(|a| {
                            Some((
                                boolean(a, "primary").unwrap_or(false),
                                string(a, "privateIpAddress")?,
                            ))
                        })
                        .collect();
                    if ips.is_empty() {
                        ips.extend(string(i, "privateIpAddress").map(|ip| (true, ip)));
                    }
                    // Primary first, the rest in the order given.
                    ips.sort_by_key(|(primary, _)| !*primary);
                    ips.into_iter().map(|(_, ip)| ip).collect()
                },
                ipv6: list(i, "ipv6AddressesSet")
                    .filter_map(|a| string(a, "ipv6Address"))
                    .collect(),
            })
            .collect(),
        security_groups: {
            // The instance's groups; moto lists them only on the network interfaces (AWS: on
            // both), so the primary interface's groups otherwise.
            let own: Vec<String> = list(n, "groupSet")
                .filter_map(|g| string(g, "groupId"))
                .collect();
            if own.is_empty() {
                list(n, "networkInterfaceSet")
                    .filter(|i| {
                        child(*i, "attachment")
                            .and_then(|a| number::<u32>(a, "deviceIndex"))
                            .unwrap_or(0)
                            == 0
                    })
                    .flat_map(|i| list(i, "groupSet").filter_map(|g| string(g, "groupId")))
                    .collect()
            } else {
                own
            }
        },
        tags: tags(n, "tagSet"),
    }
}

/// One ingress rule of a security group, flattened to one source CIDR.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IngressRule {
    /// `tcp`, `udp`, `icmp`, `-1`.
    pub protocol: String,
    /// From port (ICMP: type).
    pub from: i32,
    /// To port (ICMP: code).
    pub to: i32,
    /// IPv4 or IPv6 CIDR.
    pub cidr: String,
    /// The rule's description (how the AWS CCM recognises its own rules).
    pub description: String,
}

/// One ingress rule of a security group whose source is another group (a group pair).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupRule {
    /// `tcp`, `udp`, `icmp`, `-1`.
    pub protocol: String,
    /// From port (`-1`: all).
    pub from: i32,
    /// To port (`-1`: all).
    pub to: i32,
    /// The source group.
    pub group_id: String,
}

/// A security group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecurityGroup {
    /// `sg-...`.
    pub id: String,
    /// Its name.
    pub name: String,
    /// Its description.
    pub description: String,
    /// VPC.
    pub vpc_id: String,
    /// Ingress rules from CIDRs, one per source CIDR.
    pub ingress: Vec<IngressRule>,
    /// Ingress rules from other security groups, one per source group.
    pub from_groups: Vec<GroupRule>,
    /// Tags.
    pub tags: BTreeMap<String, String>,
}

fn parse_security_group(n: Node<'_, '_>) -> SecurityGroup {
    let mut ingress = Vec::new();
    let mut from_groups = Vec::new();
    for p in list(n, "ipPermissions") {
        let protocol = string(p, "ipProtocol").unwrap_or_default();
        let from = number(p, "fromPort").unwrap_or(-1);
        let to = number(p, "toPort").unwrap_or(-1);
        for g in list(p, "groups") {
            if let Some(group_id) = string(g, "groupId") {
                from_groups.push(GroupRule {
                    protocol: protocol.clone(),
                    from,
                    to,
                    group_id,
                });
            }
        }
        for (set, field) in [("ipRanges", "cidrIp"), ("ipv6Ranges", "cidrIpv6")] {
            for r in list(p, set) {
                if let Some(cidr) = string(r, field) {
                    ingress.push(IngressRule {
                        protocol: protocol.clone(),
                        from,
                        to,
                        cidr,
                        description: string(r, "description").unwrap_or_default(),
                    });
                }
            }
        }
    }
    SecurityGroup {
        id: string(n, "groupId").unwrap_or_default(),
        name: string(n, "groupName").unwrap_or_default(),
        description: string(n, "groupDescription").unwrap_or_default(),
        vpc_id: string(n, "vpcId").unwrap_or_default(),
        ingress,
        from_groups,
        tags: tags(n, "tagSet"),
    }
}

fn group_ingress_params(group: &str, rules: &[GroupRule]) -> Params {
    let mut p = Params::new();
    p.set("GroupId", group);
    for (i, r) in rules.iter().enumerate() {
        let k = format!("IpPermissions.{}", i + 1);
        p.set(format!("{k}.IpProtocol"), r.protocol.as_str());
        if r.protocol != "-1" {
            p.set(format!("{k}.FromPort"), r.from.to_string());
            p.set(format!("{k}.ToPort"), r.to.to_string());
        }
        p.set(format!("{k}.Groups.1.GroupId"), r.group_id.as_str());
    }
    p
}

fn ingress_params(group: &str, rules: &[IngressRule]) -> Params {
    let mut p = Params::new();
    p.set("GroupId", group);
    for (i, r) in rules.iter().enumerate() {
        let k = format!("IpPermissions.{}", i + 1);
        p.set(format!("{k}.IpProtocol"), r.protocol.as_str());
        p.set(format!("{k}.FromPort"), r.from.to_string());
        p.set(format!("{k}.ToPort"), r.to.to_string());
        if r.cidr.contains(':') {
            p.set(format!("{k}.Ipv6Ranges.1.CidrIpv6"), r.cidr.as_str());
            p.set(
                format!("{k}.Ipv6Ranges.1.Description"),
                r.description.as_str(),
            );
        } else {
            p.set(format!("{k}.IpRanges.1.CidrIp"), r.cidr.as_str());
            p.set(
                format!("{k}.IpRanges.1.Description"),
                r.description.as_str(),
            );
        }
    }
    p
}

/// An availability zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AvailabilityZone {
    /// `us-east-1a`.
    pub name: String,
    /// `use1-az6`.
    pub id: String,
    /// `availability-zone`, `local-zone`, `wavelength-zone`.
    pub zone_type: String,
}

/// A subnet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subnet {
    /// `subnet-...`.
    pub id: String,
    /// VPC.
    pub vpc_id: String,
    /// Availability zone.
    pub zone: String,
    /// IPv4 CIDR.
    pub cidr: String,
    /// Tags.
    pub tags: BTreeMap<String, String>,
}

/// One route of a route table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteEntry {
    /// IPv4 or IPv6 destination.
    pub destination: String,
    /// The destination is IPv6.
    pub ipv6: bool,
    /// Target instance.
    pub instance_id: Option<String>,
    /// Target gateway (`local`, `igw-...`).
    pub gateway_id: Option<String>,
    /// `active` or `blackhole`.
    pub state: String,
}

/// A route table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteTable {
    /// `rtb-...`.
    pub id: String,
    /// VPC.
    pub vpc_id: String,
    /// Routes.
    pub routes: Vec<RouteEntry>,
    /// Subnets associated explicitly.
    pub subnets: Vec<String>,
    /// The VPC's main table.
    pub main: bool,
    /// Tags.
    pub tags: BTreeMap<String, String>,
}

fn parse_route_table(n: Node<'_, '_>) -> RouteTable {
    let assoc: Vec<Node<'_, '_>> = list(n, "associationSet").collect();
    RouteTable {
        id: string(n, "routeTableId").unwrap_or_default(),
        vpc_id: string(n, "vpcId").unwrap_or_default(),
        routes: list(n, "routeSet")
            .filter_map(|r| {
                let (destination, ipv6) = match string(r, "destinationCidrBlock") {
                    Some(d) => (d, false),
                    None => (string(r, "destinationIpv6CidrBlock")?, true),
                };
                Some(RouteEntry {
                    destination,
                    ipv6,
                    instance_id: string(r, "instanceId"),
                    gateway_id: string(r, "gatewayId"),
                    state: string(r, "state").unwrap_or_else(|| "active".into()),
                })
            })
            .collect(),
        subnets: assoc
            .iter()
            .filter_map(|a| string(*a, "subnetId"))
            .collect(),
        main: assoc.iter().any(|a| boolean(*a, "main") == Some(true)),
        tags: tags(n, "tagSet"),
    }
}

const EC2: &str = "ec2";

impl AwsClient {
    async fn ec2_call(&self, action: &str, params: &Params) -> Result<String, AwsError> {
        let endpoint = self.ec2.clone();
        self.call(&endpoint, action, params).await
    }

    /// Every page of the EC2 Describe `action` with `filters` (`MaxResults` 1000 when
    /// `max_results`): `items` appends what each page's root element holds.
    async fn ec2_describe_all<T>(
        &self,
        action: &'static str,
        filters: &[(&str, &[String])],
        max_results: bool,
        mut items: impl FnMut(Node<'_, '_>, &mut Vec<T>),
    ) -> Result<Vec<T>, AwsError> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut p = Params::new();
            p.ec2_filters(filters);
            if max_results {
                p.set("MaxResults", "1000");
            }
            if let Some(t) = &token {
                p.set("NextToken", t.as_str());
            }
            let body = self.ec2_call(action, &p).await?;
            let doc = parse(EC2, action, &body)?;
            let root = doc.root_element();
            items(root, &mut out);
            token = string(root, "nextToken");
            if token.is_none() {
                return Ok(out);
            }
        }
    }

    /// DescribeInstances with filters, every page. Instances whose ID, private DNS name, ...
    /// match none of the values are simply absent (no error, unlike `InstanceId.N`).
    pub async fn describe_instances(
        &self,
        filters: &[(&str, &[String])],
    ) -> Result<Vec<Instance>, AwsError> {
        self.ec2_describe_all("DescribeInstances", filters, true, |root, out| {
            for r in list(root, "reservationSet") {
                out.extend(list(r, "instancesSet").map(parse_instance));
            }
        })
        .await
    }

    /// DescribeAvailabilityZones (every zone of the region).
    pub async fn describe_availability_zones(&self) -> Result<Vec<AvailabilityZone>, AwsError> {
        let mut p = Params::new();
        p.set("AllAvailabilityZones", "true");
        let body = self.ec2_call("DescribeAvailabilityZones", &p).await?;
        let doc = parse(EC2, "DescribeAvailabilityZones", &body)?;
        Ok(list(doc.root_element(), "availabilityZoneInfo")
            .filter_map(|z| {
                Some(AvailabilityZone {
                    name: string(z, "zoneName")?,
                    id: string(z, "zoneId").unwrap_or_default(),
                    zone_type: string(z, "zoneType").unwrap_or_else(|| "availability-zone".into()),
                })
            })
            .collect())
    }

    /// DescribeSubnets with filters.
    pub async fn describe_subnets(
        &self,
        filters: &[(&str, &[String])],
    ) -> Result<Vec<Subnet>, AwsError> {
        self.ec2_describe_all("DescribeSubnets", filters, false, |root, out| {
            out.extend(list(root, "subnetSet").filter_map(|s| {
                Some(Subnet {
                    id: string(s, "subnetId")?,
                    vpc_id: string(s, "vpcId").unwrap_or_default(),
                    zone: string(s, "availabilityZone").unwrap_or_default(),
                    cidr: string(s, "cidrBlock").unwrap_or_default(),
                    tags: tags(s, "tagSet"),
                })
            }));
        })
        .await
    }

    /// DescribeRouteTables with filters.
    pub async fn describe_route_tables(
        &self,
        filters: &[(&str, &[String])],
    ) -> Result<Vec<RouteTable>, AwsError> {
        self.ec2_describe_all("DescribeRouteTables", filters, false, |root, out| {
            out.extend(list(root, "routeTableSet").map(parse_route_table));
        })
        .await
    }

    /// CreateRoute `destination` → `instance_id` in `table`.
    pub async fn create_route(
        &self,
        table: &str,
        destination: &str,
        ipv6: bool,
        instance_id: &str,
    ) -> Result<(), AwsError> {
        let mut p = Params::new();
        p.set("RouteTableId", table)
            .set(
                if ipv6 {
                    "DestinationIpv6CidrBlock"
                } else {
                    "DestinationCidrBlock"
                },
                destination,
            )
            .set("InstanceId", instance_id);
        self.ec2_call("CreateRoute", &p).await.map(drop)
    }

    /// DeleteRoute `destination` from `table`.
    pub async fn delete_route(
        &self,
        table: &str,
        destination: &str,
        ipv6: bool,
    ) -> Result<(), AwsError> {
        let mut p = Params::new();
        p.set("RouteTableId", table).set(
            if ipv6 {
                "DestinationIpv6CidrBlock"
            } else {
                "DestinationCidrBlock"
            },
            destination,
        );
        self.ec2_call("DeleteRoute", &p).await.map(drop)
    }

    /// DescribeSecurityGroups with filters, every page.
    pub async fn describe_security_groups(
        &self,
        filters: &[(&str, &[String])],
    ) -> Result<Vec<SecurityGroup>, AwsError> {
        self.ec2_describe_all("DescribeSecurityGroups", filters, false, |root, out| {
            out.extend(list(root, "securityGroupInfo").map(parse_security_group));
        })
        .await
    }

    /// Authorize or revoke (`action`) `rules` on `group`, with the parameters `params` builds;
    /// no call for no rules.
    async fn change_ingress<R>(
        &self,
        action: &str,
        group: &str,
        rules: &[R],
        params: fn(&str, &[R]) -> Params,
    ) -> Result<(), AwsError> {
        if rules.is_empty() {
            return Ok(());
        }
        self.ec2_call(action, &params(group, rules)).await.map(drop)
    }

    /// AuthorizeSecurityGroupIngress of `rules` (one permission per rule).
    pub async fn authorize_ingress(
        &self,
        group: &str,
        rules: &[IngressRule],
    ) -> Result<(), AwsError> {
        self.change_ingress(
            "AuthorizeSecurityGroupIngress",
            group,
            rules,
            ingress_params,
        )
        .await
    }

    /// RevokeSecurityGroupIngress of `rules`.
    pub async fn revoke_ingress(&self, group: &str, rules: &[IngressRule]) -> Result<(), AwsError> {
        self.change_ingress("RevokeSecurityGroupIngress", group, rules, ingress_params)
            .await
    }

    /// AuthorizeSecurityGroupIngress of rules whose source is another group.
    pub async fn authorize_group_ingress(
        &self,
        group: &str,
        rules: &[GroupRule],
    ) -> Result<(), AwsError> {
        self.change_ingress(
            "AuthorizeSecurityGroupIngress",
            group,
            rules,
            group_ingress_params,
        )
        .await
    }

    /// RevokeSecurityGroupIngress of rules whose source is another group.
    pub async fn revoke_group_ingress(
        &self,
        group: &str,
        rules: &[GroupRule],
    ) -> Result<(), AwsError> {
        self.change_ingress(
            "RevokeSecurityGroupIngress",
            group,
            rules,
            group_ingress_params,
        )
        .await
    }

    /// CreateSecurityGroup in `vpc`, tagged at creation; returns its ID.
    pub async fn create_security_group(
        &self,
        name: &str,
        description: &str,
        vpc: &str,
        tags: &BTreeMap<String, String>,
    ) -> Result<String, AwsError> {
        let mut p = Params::new();
        p.set("GroupName", name)
            .set("GroupDescription", description)
            .set("VpcId", vpc);
        if !tags.is_empty() {
            p.set("TagSpecification.1.ResourceType", "security-group");
            for (i, (k, v)) in tags.iter().enumerate() {
                p.set(format!("TagSpecification.1.Tag.{}.Key", i + 1), k.as_str());
                p.set(
                    format!("TagSpecification.1.Tag.{}.Value", i + 1),
                    v.as_str(),
                );
            }
        }
        let body = self.ec2_call("CreateSecurityGroup", &p).await?;
        let doc = parse(EC2, "CreateSecurityGroup", &body)?;
        string(doc.root_element(), "groupId").ok_or_else(|| AwsError {
            service: EC2,
            action: "CreateSecurityGroup".into(),
            status: Some(200),
            code: "MalformedResponse".into(),
            message: "no groupId in the answer".into(),
        })
    }

    /// DeleteSecurityGroup (absent: Ok).
    pub async fn delete_security_group(&self, id: &str) -> Result<(), AwsError> {
        let mut p = Params::new();
        p.set("GroupId", id);
        match self.ec2_call("DeleteSecurityGroup", &p).await {
            Err(e) if e.code() != "InvalidGroup.NotFound" => Err(e),
            _ => Ok(()),
        }
    }

    /// CreateTags on one resource.
    pub async fn create_tags(
        &self,
        resource: &str,
        tags: &BTreeMap<String, String>,
    ) -> Result<(), AwsError> {
        if tags.is_empty() {
            return Ok(());
        }
        let mut p = Params::new();
        p.set("ResourceId.1", resource);
        for (i, (k, v)) in tags.iter().enumerate() {
            p.set(format!("Tag.{}.Key", i + 1), k.as_str());
            p.set(format!("Tag.{}.Value", i + 1), v.as_str());
        }
        self.ec2_call("CreateTags", &p).await.map(drop)
    }

    /// ModifyInstanceAttribute `SourceDestCheck` (routed pod traffic needs it off).
    pub async fn set_source_dest_check(
        &self,
        instance_id: &str,
        enabled: bool,
    ) -> Result<(), AwsError> {
        let mut p = Params::new();
        p.set("InstanceId", instance_id).set(
            "SourceDestCheck.Value",
            if enabled { "true" } else { "false" },
        );
        self.ec2_call("ModifyInstanceAttribute", &p).await.map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_parses_with_its_interfaces() {
        let xml = r#"<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15"><reservationSet><item><instancesSet><item>
<networkInterfaceSet><item><attachment><deviceIndex>1</deviceIndex></attachment><privateIpAddressesSet><item><primary>false</primary><privateIpAddress>10.0.2.9</privateIpAddress></item><item><primary>true</primary><privateIpAddress>10.0.2.8</privateIpAddress></item></privateIpAddressesSet><ipv6AddressesSet><item><ipv6Address>2600::1</ipv6Address></item></ipv6AddressesSet><status>in-use</status></item>
<item><attachment><deviceIndex>0</deviceIndex></attachment><privateIpAddress>10.0.1.4</privateIpAddress><status>in-use</status></item></networkInterfaceSet>
<tagSet><item><key>Name</key><value>n1</value></item></tagSet>
<instanceId>i-1</instanceId><instanceState><code>16</code><name>running</name></instanceState><privateDnsName>ip-10-0-1-4.ec2.internal</privateDnsName><dnsName/>
<instanceType>m5.large</instanceType><placement><availabilityZone>us-east-1a</availabilityZone></placement><privateIpAddress>10.0.1.4</privateIpAddress><ipAddress>54.1.2.3</ipAddress>
</item></instancesSet></item></reservationSet></DescribeInstancesResponse>"#;
        let doc = roxmltree::Document::parse(xml).unwrap();
        let r = list(doc.root_element(), "reservationSet").next().unwrap();
        let i = parse_instance(list(r, "instancesSet").next().unwrap());
        assert_eq!(i.id, "i-1");
        assert_eq!(i.state, "running");
        assert_eq!(i.zone, "us-east-1a");
        assert_eq!(i.public_dns, None);
        assert_eq!(i.public_ip.as_deref(), Some("54.1.2.3"));
        assert_eq!(i.interfaces.len(), 2);
        assert_eq!(i.interfaces[0].private_ips, vec!["10.0.2.8", "10.0.2.9"]);
        assert_eq!(i.interfaces[0].ipv6, vec!["2600::1"]);
        assert_eq!(i.interfaces[1].private_ips, vec!["10.0.1.4"]);
        assert_eq!(i.tags["Name"], "n1");
    }

    #[test]
    fn a_security_group_parses_flattened() {
        let xml = r#"<R><securityGroupInfo><item><groupId>sg-1</groupId><vpcId>vpc-1</vpcId>
<ipPermissions><item><ipProtocol>tcp</ipProtocol><fromPort>30080</fromPort><toPort>30080</toPort>
<ipRanges><item><cidrIp>10.1.0.0/16</cidrIp><description>kubernetes.io/rule/nlb/client=a1</description></item><item><cidrIp>10.2.0.0/16</cidrIp></item></ipRanges>
<ipv6Ranges><item><cidrIpv6>fd00::/8</cidrIpv6></item></ipv6Ranges></item></ipPermissions>
<tagSet><item><key>kubernetes.io/cluster/c</key><value>owned</value></item></tagSet></item></securityGroupInfo></R>"#;
        let doc = roxmltree::Document::parse(xml).unwrap();
        let g = parse_security_group(
            list(doc.root_element(), "securityGroupInfo")
                .next()
                .unwrap(),
        );
        assert_eq!(g.id, "sg-1");
        assert_eq!(g.ingress.len(), 3);
        assert_eq!(g.ingress[0].description, "kubernetes.io/rule/nlb/client=a1");
        assert_eq!((g.ingress[0].from, g.ingress[0].to), (30080, 30080));
        assert_eq!(g.ingress[2].cidr, "fd00::/8");
        let p = ingress_params("sg-1", &g.ingress[..1]);
        let enc = p.encode("AuthorizeSecurityGroupIngress", "2016-11-15");
        assert!(
            enc.contains("IpPermissions.1.IpRanges.1.CidrIp=10.1.0.0%2F16"),
            "{enc}"
        );
    }

    #[test]
    fn a_route_table_parses() {
        let xml = r#"<R><routeTableSet><item><routeTableId>rtb-1</routeTableId><vpcId>vpc-1</vpcId>
<routeSet><item><destinationCidrBlock>10.0.0.0/16</destinationCidrBlock><gatewayId>local</gatewayId><state>active</state></item>
<item><destinationCidrBlock>10.244.1.0/24</destinationCidrBlock><instanceId>i-1</instanceId><state>blackhole</state></item>
<item><destinationIpv6CidrBlock>fd00::/64</destinationIpv6CidrBlock><instanceId>i-2</instanceId><state>active</state></item></routeSet>
<associationSet><item><main>true</main></item></associationSet><tagSet/></item></routeTableSet></R>"#;
        let doc = roxmltree::Document::parse(xml).unwrap();
        let t = parse_route_table(list(doc.root_element(), "routeTableSet").next().unwrap());
        assert_eq!(t.id, "rtb-1");
        assert!(t.main);
        assert_eq!(t.routes.len(), 3);
        assert_eq!(t.routes[1].state, "blackhole");
        assert!(t.routes[2].ipv6);
        assert_eq!(t.routes[2].instance_id.as_deref(), Some("i-2"));
    }
}
