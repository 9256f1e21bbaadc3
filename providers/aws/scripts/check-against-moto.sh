#!/usr/bin/env bash
# Runs `ccm-host check` (the provider conformance kit) on the aws provider against a fresh
# moto server: installs moto if missing (install-moto.sh), builds ccm-host and the plugin,
# starts moto on 127.0.0.1 (a free port), creates a VPC (two public subnets tagged for the
# cluster and for load balancers, an internet gateway, a cluster-tagged route table) and four
# instances (three running check nodes, one stopped), runs
#   ccm-host check --cloud-provider aws --node <private DNS names> --shutdown-node <stopped> ...
# twice, for a classic ELB Service (no type annotation) and for an NLB Service
# (--service-annotation service.beta.kubernetes.io/aws-load-balancer-type=nlb), prints check's
# tables, stops moto, and exits with the first failing run's exit code (0 when both pass). The
# image mode (CCM_CHECK_IMAGE) runs once, for a classic ELB.
#
#   bash providers/aws/scripts/check-against-moto.sh [extra ccm-host check flags, e.g. -o json]
#
# For the image test (deploy/image-test.sh):
#   CCM_MOTO_TLS=1          moto serves HTTPS with a certificate of a CA made here (openssl)
#   CCM_CHECK_IMAGE=IMAGE   run check in that image with podman (its own plugins, the manifests'
#                           security context, host network), not the host's build
#   CCM_CHECK_MOUNT_CA=1    mount that CA over the image's /etc/ssl/certs/ca-certificates.crt,
#                           the standard bundle path (0: do not; the HTTPS calls must then fail)
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
cd "$root"

moto_server="$(bash providers/aws/scripts/install-moto.sh)"
python="$(dirname "$moto_server")/python"

image="${CCM_CHECK_IMAGE:-}"
if [ -z "$image" ]; then
  echo "== building ccm-host and the aws plugin" >&2
  cargo build --quiet -p ccm-host-cli -p ccm-provider-aws >&2
fi
target="${CARGO_TARGET_DIR:-$root/target}"

work="$(mktemp -d)"
moto_pid=""
cleanup() {
  if [ -n "$moto_pid" ]; then kill "$moto_pid" 2>/dev/null || true; wait "$moto_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

port="$("$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
tls=()
scheme=http
ca=""
if [ "${CCM_MOTO_TLS:-0}" = 1 ]; then
  # A CA and a serving certificate for 127.0.0.1, as a private endpoint would have.
  openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=ccm-check-ca \
    -keyout "$work/ca.key" -out "$work/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 \
    -keyout "$work/moto.key" -out "$work/moto.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >"$work/ext"
  openssl x509 -req -in "$work/moto.csr" -CA "$work/ca.crt" -CAkey "$work/ca.key" -CAcreateserial \
    -days 1 -extfile "$work/ext" -out "$work/moto.crt" 2>/dev/null
  tls=(-c "$work/moto.crt" -k "$work/moto.key")
  scheme=https
  ca="$work/ca.crt"
fi
"$moto_server" -H 127.0.0.1 -p "$port" "${tls[@]}" >"$work/moto.log" 2>&1 &
moto_pid=$!
url="$scheme://127.0.0.1:$port"

cluster=ccm-check
export AWS_ACCESS_KEY_ID=ccmcheck AWS_SECRET_ACCESS_KEY=ccmcheck AWS_DEFAULT_REGION=us-east-1
# Nothing else from the environment or ~/.aws may reach the provider's credential chain.
unset AWS_SESSION_TOKEN AWS_PROFILE AWS_ROLE_ARN AWS_WEB_IDENTITY_TOKEN_FILE
export AWS_SHARED_CREDENTIALS_FILE="$work/credentials" AWS_CONFIG_FILE="$work/config"
: >"$AWS_SHARED_CREDENTIALS_FILE"
: >"$AWS_CONFIG_FILE"

echo "== moto on $url: creating the VPC and the check instances" >&2
"$python" - "$url" "$cluster" "$ca" >"$work/nodes" <<'PY'
import ssl, sys, time, urllib.request
import boto3
url, cluster, ca = sys.argv[1], sys.argv[2], sys.argv[3] or None
context = ssl.create_default_context(cafile=ca) if ca else None
for _ in range(300):
    try:
        urllib.request.urlopen(url + "/moto-api/", timeout=1, context=context)
        break
    except Exception:
        time.sleep(0.1)
else:
    sys.exit("moto did not start")
ec2 = boto3.client("ec2", endpoint_url=url, region_name="us-east-1", verify=ca)
tag = "kubernetes.io/cluster/" + cluster
vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
igw = ec2.create_internet_gateway()["InternetGateway"]["InternetGatewayId"]
ec2.attach_internet_gateway(InternetGatewayId=igw, VpcId=vpc)
rtb = ec2.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"]
ec2.create_route(RouteTableId=rtb, DestinationCidrBlock="0.0.0.0/0", GatewayId=igw)
ec2.create_tags(Resources=[rtb], Tags=[{"Key": tag, "Value": "owned"}])
subnets = []
for i, zone in enumerate(["us-east-1a", "us-east-1b"]):
    s = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.%d.0/24" % (i + 1), AvailabilityZone=zone)["Subnet"]["SubnetId"]
    ec2.modify_subnet_attribute(SubnetId=s, MapPublicIpOnLaunch={"Value": True})
    ec2.create_tags(Resources=[s], Tags=[{"Key": tag, "Value": "shared"}, {"Key": "kubernetes.io/role/elb", "Value": "1"}])
    ec2.associate_route_table(RouteTableId=rtb, SubnetId=s)
    subnets.append(s)
def run(n, subnet):
    r = ec2.run_instances(ImageId="ami-12c6146b", MinCount=n, MaxCount=n, InstanceType="m5.large", SubnetId=subnet,
                          TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": tag, "Value": "owned"}]}])
    return r["Instances"]
nodes = run(2, subnets[0]) + run(1, subnets[1])
stopped = run(1, subnets[0])[0]
ec2.stop_instances(InstanceIds=[stopped["InstanceId"]])
for i in nodes:
    print("node", i["PrivateDnsName"])
print("stopped", stopped["PrivateDnsName"])
PY

cat >"$work/cloud.conf" <<EOF
[Global]
Zone = us-east-1a
KubernetesClusterID = $cluster

[ServiceOverride "ec2"]
Service = ec2
Region = us-east-1
URL = $url
SigningRegion = us-east-1

[ServiceOverride "elb"]
Service = elasticloadbalancing
Region = us-east-1
URL = $url
SigningRegion = us-east-1
EOF

if [ -z "$image" ]; then
  mkdir -m 0700 "$work/plugins"
  cp "$target/debug/libccm_provider_aws.so" "$work/plugins/"
fi
args=()
while read -r kind name; do
  case "$kind" in
    node) args+=(--node "$name") ;;
    stopped) args+=(--shutdown-node "$name") ;;
  esac
done <"$work/nodes"

echo "== ccm-host check --cloud-provider aws ${args[*]}" >&2
status=0
if [ -n "$image" ]; then
  # The image's user (65532) reads the config and the (empty) AWS files.
  chmod 0755 "$work"
  chmod 0644 "$work/cloud.conf" "$AWS_SHARED_CREDENTIALS_FILE" "$AWS_CONFIG_FILE"
  mounts=(-v "$work/cloud.conf:/etc/ccm-host/cloud.conf:ro" -v "$work/credentials:/aws/credentials:ro"
    -v "$work/config:/aws/config:ro")
  if [ -n "$ca" ] && [ "${CCM_CHECK_MOUNT_CA:-1}" = 1 ]; then
    chmod 0644 "$ca"
    mounts+=(-v "$ca:/etc/ssl/certs/ca-certificates.crt:ro")
  fi
  podman run --rm --network host --read-only --cap-drop=ALL --security-opt no-new-privileges \
    --user 65532:65532 --memory 256m "${mounts[@]}" \
    -e AWS_ACCESS_KEY_ID -e AWS_SECRET_ACCESS_KEY -e AWS_DEFAULT_REGION \
    -e AWS_SHARED_CREDENTIALS_FILE=/aws/credentials -e AWS_CONFIG_FILE=/aws/config \
    "$image" check --cloud-provider aws --cloud-config /etc/ccm-host/cloud.conf "${args[@]}" \
    --absent-provider-id aws:///us-east-1a/i-0123456789abcdef0 \
    --cluster-name "$cluster" --cluster-cidr 10.244.0.0/16 "$@" || status=$?
  exit "$status"
fi
# Once per kind of load balancer: a Service without a type annotation gets a classic ELB (the
# AWS CCM's default), one with aws-load-balancer-type=nlb an NLB (CCM_CHECK_LB_TYPES to choose).
for lb_type in ${CCM_CHECK_LB_TYPES:-classic nlb}; do
  annotation=()
  case "$lb_type" in
    classic) ;;
    nlb) annotation=(--service-annotation service.beta.kubernetes.io/aws-load-balancer-type=nlb) ;;
    *) echo "check-against-moto: CCM_CHECK_LB_TYPES: unknown type $lb_type (classic, nlb)" >&2; exit 2 ;;
  esac
  echo "== load balancer type: $lb_type" >&2
  run_status=0
  "$target/debug/ccm-host" check --plugin-dir "$work/plugins" --cloud-provider aws \
    --cloud-config "$work/cloud.conf" "${args[@]}" "${annotation[@]}" \
    --absent-provider-id aws:///us-east-1a/i-0123456789abcdef0 \
    --cluster-name "$cluster" --cluster-cidr 10.244.0.0/16 "$@" || run_status=$?
  if [ "$run_status" -ne 0 ]; then status=$run_status; fi
done
exit "$status"
