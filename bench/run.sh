#!/usr/bin/env bash
# Run the issue-10 benchmarks several times, take the median of every figure and rewrite the
# generated part of BENCHMARKS.md (the text outside the GENERATED markers is kept).
#
# usage: bench/run.sh [--runs N] [--only LIST] [--quick] [--output FILE]
#   --runs N       runs of each benchmark (default 3; env BENCH_RUNS)
#   --only LIST    comma-separated subset of: node_init,node_init_budget,node_init_kube_qps,load_balancers,memory,
#                  memory_lb,provider_calls,instance_calls,instance_calls_kube_qps (default: all)
#   --quick        small sizes for a smoke run (500 nodes, 100 services, 10 s idle window);
#                  writes target/bench-quick.md unless --output is given
#   --output FILE  where to write (default BENCHMARKS.md at the repository root)
# Every BENCH_* variable documented in the bench sources is passed through, e.g.
#   BENCH_CONCURRENCY=1,default,16,64 bench/run.sh --only node_init
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

runs="${BENCH_RUNS:-3}"
only="node_init,node_init_budget,node_init_kube_qps,load_balancers,memory,memory_lb,provider_calls,instance_calls,instance_calls_kube_qps"
quick=0
output=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --runs) runs="${2:?--runs needs a number}"; shift 2 ;;
        --only) only="${2:?--only needs a list}"; shift 2 ;;
        --quick) quick=1; shift ;;
        --output) output="${2:?--output needs a file}"; shift 2 ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) echo "bench/run.sh: unknown argument $1 (try --help)" >&2; exit 2 ;;
    esac
done
if ! [[ "$runs" =~ ^[1-9][0-9]*$ ]]; then
    echo "bench/run.sh: --runs must be a positive number, got '$runs'" >&2
    exit 2
fi
IFS=',' read -r -a benches <<< "$only"
for b in "${benches[@]}"; do
    case "$b" in
        node_init|node_init_budget|node_init_kube_qps|load_balancers|memory|memory_lb|provider_calls|instance_calls|instance_calls_kube_qps) ;;
        *) echo "bench/run.sh: unknown benchmark '$b' (node_init, node_init_budget, node_init_kube_qps, load_balancers, memory, memory_lb, provider_calls, instance_calls, instance_calls_kube_qps)" >&2; exit 2 ;;
    esac
done
if [[ $quick == 1 ]]; then
    export BENCH_NODES="${BENCH_NODES:-500}"
    export BENCH_SERVICES="${BENCH_SERVICES:-100}"
    export BENCH_LB_NODES="${BENCH_LB_NODES:-50}"
    export BENCH_NODE_CHANGES="${BENCH_NODE_CHANGES:-20}"
    export BENCH_MEM_NODES="${BENCH_MEM_NODES:-500}"
    export BENCH_MEM_SERVICES="${BENCH_MEM_SERVICES:-1000}"
    export BENCH_IDLE_SECS="${BENCH_IDLE_SECS:-10}"
    export BENCH_CALL_ITERS="${BENCH_CALL_ITERS:-5000}"
    export BENCH_INIT_NODES="${BENCH_INIT_NODES:-500}"
    export BENCH_STEADY_NODES="${BENCH_STEADY_NODES:-200}"
    output="${output:-target/bench-quick.md}"
fi
output="${output:-BENCHMARKS.md}"

out_dir="$root/target/bench-results/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out_dir"

# bench name -> cargo package, test target, and the settings of that variant (user-set BENCH_*
# variables win).
declare -A package=(
    [node_init]=ccm-integration-tests [node_init_budget]=ccm-integration-tests
    [node_init_kube_qps]=ccm-integration-tests
    [load_balancers]=ccm-integration-tests [provider_calls]=ccm-integration-tests
    [memory]=ccm-host-cli [memory_lb]=ccm-host-cli [instance_calls]=ccm-integration-tests
    [instance_calls_kube_qps]=ccm-integration-tests
)
declare -A target=(
    [node_init]=bench_node_init [node_init_budget]=bench_node_init
    [node_init_kube_qps]=bench_node_init
    [load_balancers]=bench_load_balancers [provider_calls]=bench_provider_calls
    [memory]=bench_memory [memory_lb]=bench_memory [instance_calls]=bench_instance_calls
    [instance_calls_kube_qps]=bench_instance_calls
)
declare -A settings=(
    [node_init]="" [load_balancers]="" [provider_calls]="" [instance_calls]=""
    # Our default concurrency under a 200 calls/s cloud budget (the default is no budget).
    [node_init_budget]="BENCH_LATENCIES_MS=50 BENCH_CONCURRENCY=default BENCH_CLOUD_QPS=200"
    # Field conditions: the default client limit (20 qps) next to no limit, same run.
    [node_init_kube_qps]="BENCH_NODES=1000 BENCH_LATENCIES_MS=50 BENCH_CONCURRENCY=default BENCH_KUBE_QPS=default,unlimited"
    # Watched state only, then with load balancers (every LB call carries every node).
    [memory]="BENCH_MEM_LB_SERVICES=0" [memory_lb]="BENCH_MEM_LB_SERVICES=10"
    # Bulk lookups next to the per-node path at the default client limit (20 qps): initialisation
    # only, 1,000 nodes (5,000 would take ~12 min per path).
    [instance_calls_kube_qps]="BENCH_PHASES=init BENCH_INIT_NODES=1000 BENCH_KUBE_QPS=default"
)

# The variant's settings, minus the variables the user set.
settings_of() {
    local out="" kv name
    for kv in ${settings[$1]}; do
        name="${kv%%=*}"
        if [[ -z "${!name:-}" ]]; then out+="$kv "; fi
    done
    echo "$out"
}

command_of() {
    local s
    s="$(settings_of "$1")"
    echo "${s:+env $s}cargo test --release -p ${package[$1]} --test ${target[$1]} -- --ignored --nocapture"
}

echo "== building the benchmarks (release)"
declare -A built=()
for b in "${benches[@]}"; do
    [[ -n "${built[${target[$b]}]:-}" ]] && continue
    cargo test --release -p "${package[$b]}" --test "${target[$b]}" --no-run
    built[${target[$b]}]=1
done

load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
for b in "${benches[@]}"; do
    for ((i = 1; i <= runs; i++)); do
        echo "== $b, run $i of $runs"
        log="$out_dir/$b-$i.log"
        # shellcheck disable=SC2046
        if ! $(command_of "$b") > "$log" 2>&1; then
            echo "bench/run.sh: $b run $i failed; see $log" >&2
            tail -n 30 "$log" >&2
            exit 1
        fi
        grep '^BENCH ' "$log" || { echo "bench/run.sh: $b printed no BENCH line; see $log" >&2; exit 1; }
    done
done
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"

env_used="$(env | grep '^BENCH_' | sort | tr '\n' ' ' || true)"
commands=""
for b in "${benches[@]}"; do
    commands+="$(command_of "$b")"$'\n'
done

python3 - "$out_dir" "$output" "$runs" "$load_before" "$load_after" "$env_used" "$commands" <<'PY'
import glob, os, platform, re, statistics, subprocess, sys, datetime

out_dir, output, runs, load_before, load_after, env_used, commands = sys.argv[1:8]

# Parameters identify a case; every other numeric field is a measurement (median over runs).
PARAMS = {
    "node_init": ["nodes", "latency_ms", "concurrency", "cloud_qps", "kube_qps"],
    "load_balancers": ["services", "nodes", "node_changes", "latency_ms", "cloud_qps",
                       "cloud_burst", "concurrency"],
    "memory": ["nodes", "services", "lb_services", "images"],
    "provider_calls": ["node_json_bytes"],
    "plugin_load": ["plugin", "so_bytes"],
    "bulk_init": ["path", "nodes", "latency_ms", "kube_qps"],
    "steady_calls": ["path", "nodes", "not_ready", "time_scale"],
}

cases = {}  # (bench, params tuple) -> {field: [values]}
order = []
for path in sorted(glob.glob(os.path.join(out_dir, "*.log"))):
    with open(path) as f:
        for line in f:
            if not line.startswith("BENCH "):
                continue
            words = line.split()
            bench = words[1]
            kv = dict(w.split("=", 1) for w in words[2:] if "=" in w)
            key = (bench, tuple((p, kv.get(p, "")) for p in PARAMS.get(bench, [])))
            if key not in cases:
                cases[key] = {}
                order.append(key)
            for k, v in kv.items():
                if k in PARAMS.get(bench, []):
                    continue
                try:
                    cases[key].setdefault(k, []).append(float(v))
                except ValueError:
                    pass

def med(key, field):
    vals = cases[key].get(field, [])
    return statistics.median(vals) if vals else float("nan")

def runs_of(key):
    return max((len(v) for v in cases[key].values()), default=0)

def params(key):
    return dict(key[1])

def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
    except Exception:
        return "?"

cpu = sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip() or platform.processor()
mem = sh("awk '/MemTotal/ {printf \"%.1f GiB\", $2/1048576}' /proc/meminfo")
lines = []
w = lines.append
w("## Figures (generated by `bench/run.sh`)")
w("")
w(f"- Date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}, "
  f"commit `{sh('git rev-parse --short HEAD')}`{' (dirty tree)' if sh('git status --porcelain -- host tests providers provider-abi') else ''}")
w(f"- Machine: {sh('nproc')} CPUs ({cpu}), {mem} RAM, Linux {platform.release()}")
w(f"- Toolchain: {sh('rustc --version')}, release profile")
w(f"- Load average (1/5/15 min) before: {load_before}; after: {load_after}. "
  "The machine is shared: other builds may have run at the same time.")
w(f"- Runs per benchmark: {runs}; every figure is the median over the runs.")
if env_used.strip():
    w(f"- Settings: `{env_used.strip()}`")
w("- Commands:")
w("")
w("```")
for c in commands.strip().splitlines():
    w(c)
w("```")
w("")

def fmt(x, nd=2):
    if x != x:
        return "–"
    return f"{x:.{nd}f}"

node = [k for k in order if k[0] == "node_init"]
if node:
    w("### 1. Node initialisation")
    w("")
    w("Tainted nodes created at once; time until every node is initialised (taint removed, provider ID, "
      "labels, cloud addresses). Target: < 10 s at 50 ms, <= 2 node writes per node. "
      "--kube-api-qps is the node controller's client-side API limit: at the default (20, burst 30) the "
      "time is bound by it (about three requests per node: two node writes and one event); 'none' "
      "measures the controller's own speed.")
    w("")
    w("| nodes | provider latency | --concurrent-node-syncs | --cloud-api-qps | --kube-api-qps | time (s) | nodes/s | vs concurrency 1 | node writes/node | event writes/node | provider calls/node | target |")
    w("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for k in node:
        p = params(k)
        t = med(k, "seconds")
        base = [b for b in node if params(b)["latency_ms"] == p["latency_ms"]
                and params(b)["concurrency"] == "1" and params(b)["nodes"] == p["nodes"]
                and params(b)["cloud_qps"] == p["cloud_qps"]
                and params(b)["kube_qps"] == p["kube_qps"]]
        ratio = med(base[0], "seconds") / t if base else float("nan")
        writes = med(k, "node_writes_per_node")
        target = ""
        kube_qps = "none" if p["kube_qps"] in ("", "unlimited") else p["kube_qps"]
        if p["latency_ms"] == "50" and p["nodes"] == "5000" and kube_qps == "none":
            target = ("met" if t < 10 and writes <= 2 else "missed") + " (< 10 s, <= 2 writes)"
        qps = "none" if float(p["cloud_qps"]) == 0 else p["cloud_qps"]
        w(f"| {p['nodes']} | {p['latency_ms']} ms | {p['concurrency']} | {qps} | {kube_qps} | {fmt(t)} | "
          f"{fmt(med(k, 'nodes_per_s'), 0)} | {fmt(ratio, 1)}x | {fmt(writes)} | "
          f"{fmt(med(k, 'event_writes_per_node'))} | {fmt(med(k, 'provider_calls_per_node'))} | {target} |")
    w("")

lbs = [k for k in order if k[0] == "load_balancers"]
if lbs:
    p0 = params(lbs[0])
    w("### 2. Load balancers")
    w("")
    w(f"{p0['services']} LoadBalancer services created at once on {p0['nodes']} nodes, provider latency "
      f"{p0['latency_ms']} ms per call, cloud budget {p0['cloud_qps']} calls/s (burst {p0['cloud_burst']}); "
      f"then {p0['node_changes']} nodes excluded from load balancers at once. "
      "Target: < 10 s for each phase.")
    w("")
    w("| --concurrent-service-syncs | time to all ingress statuses (s) | EnsureLoadBalancer calls | service writes/service | time to final hosts after node changes (s) | UpdateLoadBalancer calls | updates/service | target |")
    w("|---:|---:|---:|---:|---:|---:|---:|---|")
    for k in lbs:
        p = params(k)
        a, b = med(k, "provision_seconds"), med(k, "rehost_seconds")
        target = ("met" if a < 10 and b < 10 else "missed") if p["services"] == "1000" else ""
        w(f"| {p['concurrency']} | {fmt(a)} | {fmt(med(k, 'ensure_calls'), 0)} | "
          f"{fmt(med(k, 'service_writes_per_service'))} | {fmt(b)} | {fmt(med(k, 'update_calls'), 0)} | "
          f"{fmt(med(k, 'update_calls_per_service'))} | {target} |")
    w("")

memk = [k for k in order if k[0] == "memory"]
if memk:
    w("### 3. Memory and idle CPU (real binary)")
    w("")
    w("`ccm-host run` (release) against the in-memory API server, fake provider in-process. "
      "Target: peak RSS < 60 MiB.")
    w("")
    w("| nodes (images each) | services (LoadBalancer) | time to sync (s) | peak RSS after sync (MiB) | RSS after sync (MiB) | peak RSS at end (MiB) | RSS at end (MiB) | idle window (s) | idle CPU (s) | idle CPU (% of one core) | threads | LB node syncs at sync / at end | target |")
    w("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for k in memk:
        p = params(k)
        peak = med(k, "peak_rss_end_mib")
        target = ("met" if peak < 60 else "missed") + " (< 60 MiB)"
        w(f"| {p['nodes']} ({p['images']}) | {p['services']} ({p['lb_services']}) | {fmt(med(k, 'sync_seconds'), 1)} | "
          f"{fmt(med(k, 'peak_rss_sync_mib'), 1)} | {fmt(med(k, 'rss_sync_mib'), 1)} | {fmt(peak, 1)} | "
          f"{fmt(med(k, 'rss_end_mib'), 1)} | {fmt(med(k, 'idle_seconds'), 0)} | {fmt(med(k, 'idle_cpu_seconds'))} | "
          f"{fmt(med(k, 'idle_cpu_percent'))} | {fmt(med(k, 'threads'), 0)} | "
          f"{fmt(med(k, 'lb_node_syncs_at_sync'), 0)} / {fmt(med(k, 'lb_node_syncs_at_end'), 0)} | {target} |")
    w("")

calls = [k for k in order if k[0] == "provider_calls"]
loads = [k for k in order if k[0] == "plugin_load"]
if calls or loads:
    w("### 4. Provider call overhead and plugin load time")
    w("")
    for k in calls:
        p = params(k)
        w(f"`InstanceMetadata` of the fake provider on a {p['node_json_bytes']}-byte node, median per call (µs):")
        w("")
        w("| path | µs/call |")
        w("|---|---:|")
        w(f"| direct trait call (rlib, parsed `Node`) | {fmt(med(k, 'direct_us'))} |")
        w(f"| raw ABI call through the `.so` (JSON prepared once; includes the SDK's JSON parse) | {fmt(med(k, 'raw_abi_us'))} |")
        w(f"| host-side serialisation of the node (per call) | {fmt(med(k, 'host_serialise_us'))} |")
        w(f"| typed `Provider::instance_metadata` (serialise, coalescing, blocking pool, deadline, metrics) | {fmt(med(k, 'provider_us'))} |")
        w(f"| host wrapper alone (`Provider::call` with a no-op closure) | {fmt(med(k, 'wrapper_us'))} |")
        w(f"| ABI overhead over direct (raw ABI − direct) | {fmt(med(k, 'abi_over_direct_us'))} |")
        w(f"| host path over raw ABI (typed − raw ABI) | {fmt(med(k, 'provider_over_raw_abi_us'))} |")
        w("")
    if loads:
        w("| plugin | .so size (MiB) | load time median (ms) | min (ms) | max (ms) |")
        w("|---|---:|---:|---:|---:|")
        for k in loads:
            p = params(k)
            w(f"| {p['plugin']} | {fmt(float(p['so_bytes']) / 1048576, 1)} | {fmt(med(k, 'median_ms'), 1)} | "
              f"{fmt(med(k, 'min_ms'), 1)} | {fmt(med(k, 'max_ms'), 1)} |")
        w("")

inits = [k for k in order if k[0] == "bulk_init"]
steady = [k for k in order if k[0] == "steady_calls"]
if inits or steady:
    w("### 5. Cloud calls: bulk instance lookups next to the per-node path")
    w("")
    w("One run, the same nodes and cloud for both paths; the fake provider with `bulkInstances: true` "
      "(bulk) or `false` (per node: upstream's pattern), every other setting at its default "
      "(`--instance-batch-window 100ms`, `--instance-batch-size 500`, 64 workers). The nodes' outcomes "
      "(provider ID, labels, addresses, taints) of the two paths are compared and identical (asserted). "
      "'--kube-api-qps none' = the node controller's client without a rate limit.")
    w("")
if inits:
    w("| path | nodes | provider latency | --kube-api-qps | cloud calls | calls/node | batches (largest) | time (s) | nodes/s | node writes/node | calls of the address pass right after | goal |")
    w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for k in inits:
        p = params(k)
        calls = med(k, "cloud_calls")
        goal = ""
        if p["path"] == "bulk" and p["nodes"] == "5000" and p["latency_ms"] == "50":
            goal = ("met" if calls <= 20 else "missed") + " (<= 20 calls)"
        kube_qps = "none" if p["kube_qps"] in ("", "unlimited") else p["kube_qps"]
        batches = med(k, "batch_calls")
        largest = f"{fmt(batches, 0)} ({fmt(med(k, 'max_batch'), 0)})" if batches == batches and batches > 0 else "–"
        w(f"| {p['path'].replace('_', '-')} | {p['nodes']} | {p['latency_ms']} ms | {kube_qps} | {fmt(calls, 0)} | "
          f"{fmt(med(k, 'calls_per_node'), 3)} | {largest} | {fmt(med(k, 'seconds'))} | {fmt(med(k, 'nodes_per_s'), 0)} | "
          f"{fmt(med(k, 'node_writes_per_node'))} | {fmt(med(k, 'address_pass_calls'), 0)} | {goal} |")
    w("")
if steady:
    w("Steady state: one simulated hour of the default periods (address loop every 5 min, lifecycle "
      "checks every 5 s: 12 + 720 passes of the real pass functions, time scaled down as in the "
      "time-scale column, the controllers' max-ages with it); calls counted over exactly those passes.")
    w("")
    w("| path | nodes | NotReady | time scale | address passes | lifecycle passes | address-loop calls | lifecycle calls | calls per simulated hour | per 1,000 nodes | goal |")
    w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for k in steady:
        p = params(k)
        per_k = med(k, "calls_per_1000_nodes_per_hour")
        goal = ""
        if p["path"] == "bulk" and p["not_ready"] == "0":
            goal = ("met" if per_k <= 50 else "missed") + " (<= 50 per 1,000 nodes)"
        w(f"| {p['path'].replace('_', '-')} | {p['nodes']} | {p['not_ready']} | {p['time_scale']}x | "
          f"{fmt(med(k, 'address_passes'), 0)} | {fmt(med(k, 'lifecycle_passes'), 0)} | {fmt(med(k, 'address_calls'), 0)} | "
          f"{fmt(med(k, 'lifecycle_calls'), 0)} | {fmt(med(k, 'calls_per_hour'), 0)} | {fmt(per_k, 0)} | {goal} |")
    w("")

generated = "\n".join(lines)
BEGIN, END = "<!-- BEGIN GENERATED: bench/run.sh -->", "<!-- END GENERATED -->"
if os.path.exists(output):
    text = open(output).read()
else:
    text = ("# Benchmarks\n\nFigures of issue 10 (speed, memory, call overhead). Regenerate with "
            "`bench/run.sh`; only the part between the GENERATED markers is rewritten.\n\n"
            f"{BEGIN}\n{END}\n")
if BEGIN in text and END in text:
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    text = f"{head}{BEGIN}\n{generated}\n{END}{tail}"
else:
    text = f"{text.rstrip()}\n\n{BEGIN}\n{generated}\n{END}\n"
with open(output, "w") as f:
    f.write(text)
print(f"wrote {output} (raw logs in {out_dir})")
PY
