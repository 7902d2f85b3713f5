#!/usr/bin/env bash
# One REAL node beside kwok's fake ones (#29 item 6): containerd and runc (Debian packages),
# the kubelet built from the control plane's own Kubernetes source (build.sh), Debian's CNI
# bridge plugin, the stack's local Debian image imported into containerd, and two "GPUs"
# advertised as an extended resource (a site without GPUs tests this way). Kueue admits onto
# it through its own ResourceFlavor (tainted node, tolerated by the flavor) and ClusterQueue,
# so no kwok-pool job ever lands on it, and no job of this node's pool lands on kwok's.
#
# Run by stack/up.sh after `kube` (and `images`; `images.sh base` is run here when the Debian
# image is missing) and by `make run-kube`. Idempotent: running processes are kept. State under
# <repo>/.stack/kube/node/; settings for tests in <repo>/.stack/kube/node.env.
#
# Facts this relies on (docs/testing.md, "The real node"):
# - this VM has cgroup v1 (hybrid): kubelet 1.35 refuses it unless failCgroupV1: false;
# - no systemd: cgroupDriver cgroupfs, and containerd/kubelet run as plain processes;
# - no registry is reachable: the pause image is built here from the Kubernetes source's
#   build/pause/linux/pause.c and imported, like the worker image;
# - runc cannot raise rlimits here (../shared/LOCAL-CONTAINERS.md): containerd's default
#   spec sets explicit lower ones (RLIMIT_NOFILE 1024), which works.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
KSTATE="$(cd -P "$REPO/.stack/kube" && pwd)"
N="$KSTATE/node"
CACHE="${ISTHMUS_CACHE:-/var/cache/isthmus}/kube"
source "$HERE/versions.sh"
source "$HERE/../users.sh"

API_PORT="${ISTHMUS_KUBE_API_PORT:-16443}"
KUBELET_PORT="${ISTHMUS_KUBE_NODE_PORT:-16450}"      # the kubelet's server (pods/log, exec)
HEALTHZ_PORT="${ISTHMUS_KUBE_NODE_HEALTHZ_PORT:-16451}"
NODE="${ISTHMUS_KUBE_NODE_NAME:-isthmus-node-1}"
ACCOUNTS="${ISTHMUS_KUBE_ACCOUNTS:-team-a team-b team-c}"
NS_PREFIX="${ISTHMUS_KUBE_NS_PREFIX:-isthmus-}"
GPU_TYPE_LABEL="${ISTHMUS_KUBE_GPU_TYPE_LABEL:-nvidia.com/gpu.product}"
PRODUCT="${ISTHMUS_KUBE_NODE_PRODUCT:-emulated}"      # its "GPU" product label
GPUS="${ISTHMUS_KUBE_NODE_GPUS:-2}"
CQ="${ISTHMUS_KUBE_NODE_CLUSTER_QUEUE:-isthmus-node}"
LQ="${ISTHMUS_KUBE_NODE_LOCAL_QUEUE:-isthmus-node}"
FLAVOR=isthmus-node-flavor
TAINT_KEY=isthmus.io/real-node
IMAGE=localhost/isthmus-debian:bookworm               # stack/images.sh
PAUSE_IMAGE=localhost/isthmus-pause:3.10
POD_SUBNET="${ISTHMUS_KUBE_NODE_POD_SUBNET:-10.245.0.0/24}"
# The kubelet refuses a loopback node IP (127.0.0.0/8), and the API server reaches a node's
# kubelet (pods/log) at the node's IP: a private address added to the loopback device is
# both, so the kubelet still listens on loopback only.
NODE_IP="${ISTHMUS_KUBE_NODE_IP:-10.246.0.1}"
# containerd's sockets: a short path (a unix socket path has at most 107 bytes).
RUN=/run/isthmus-containerd
SOCK="$RUN/containerd.sock"
TIMEOUT_S="${ISTHMUS_KUBE_UP_TIMEOUT_S:-180}"

mkdir -p "$N"/{cni,cni-ipam,kubelet,containerd,logs,pki} "$KSTATE/pids" "$RUN"
say() { echo "[kube node] $*"; }
C="$KSTATE/certs"
URL="https://127.0.0.1:$API_PORT"
api() { curl -sS --fail --max-time 30 --cacert "$C/ca.crt" --cert "$C/admin.crt" --key "$C/admin.key" "$@"; }
apply() { api -X PATCH "$URL$1?fieldManager=isthmus-stack&force=true" \
            -H "Content-Type: application/apply-patch+yaml" --data-binary @"${2:--}" > /dev/null; }
wait_until() {
  local what=$1; shift; local deadline=$((SECONDS + TIMEOUT_S))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS > deadline)); then say "timed out waiting for $what"; return 1; fi
    sleep 0.5
  done
}
alive() { [[ -f "$KSTATE/pids/$1.pid" ]] && kill -0 "$(cat "$KSTATE/pids/$1.pid")" 2>/dev/null; }
start() {
  local name=$1; shift
  if alive "$name"; then return 0; fi
  say "starting $name"
  setsid nohup "$@" >> "$N/logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$KSTATE/pids/$name.pid"
}

api "$URL/readyz" > /dev/null || { say "the control plane is not up (stack/kube/up.sh)"; exit 1; }

# ---------------------------------------------------------------- packages, binaries
need=()
command -v containerd >/dev/null || need+=(containerd)
command -v runc >/dev/null || need+=(runc)
[[ -x /usr/lib/cni/bridge ]] || need+=(containernetworking-plugins)
command -v gcc >/dev/null || need+=(gcc libc6-dev)
if ((${#need[@]})); then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" > /dev/null \
    || { apt-get update -q > /dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" > /dev/null; }
fi
KUBELET="$CACHE/kubelet-$K8S_VERSION/kubelet"
[[ -x "$KUBELET" ]] || "$HERE/build.sh" > "$N/logs/build.log" 2>&1 || { tail -20 "$N/logs/build.log"; exit 1; }

# The pause image, from the same Kubernetes source (no registry to pull it from).
PAUSE_TAR="$CACHE/pause-$K8S_VERSION/pause-image.tar"
if [[ ! -s "$PAUSE_TAR" ]]; then
  say "building the pause image"
  src=$(cd "$CACHE/src/wrapper-$K8S_VERSION-kueue-$KUEUE_VERSION" && GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' k8s.io/kubernetes)
  d=$(mktemp -d)
  gcc -Os -static -Wall -Werror -DVERSION="$K8S_VERSION-isthmus" -o "$d/pause" "$src/build/pause/linux/pause.c"
  printf 'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n' > "$d/Containerfile"
  podman build -q -t "$PAUSE_IMAGE" "$d" > /dev/null
  mkdir -p "$(dirname "$PAUSE_TAR")"
  podman save -q --format docker-archive -o "$PAUSE_TAR.tmp" "$PAUSE_IMAGE" && mv "$PAUSE_TAR.tmp" "$PAUSE_TAR"
  rm -rf "$d"
fi
# The worker image: the stack's Debian base, saved once per image id.
podman image exists "$IMAGE" 2>/dev/null || bash "$REPO/stack/images.sh" base
image_id=$(podman image inspect --format '{{.Id}}' "$IMAGE" | cut -c1-12)
IMAGE_TAR="$N/images/debian-$image_id.tar"
if [[ ! -s "$IMAGE_TAR" ]]; then
  rm -rf "$N/images"; mkdir -p "$N/images"
  podman save -q --format docker-archive -o "$IMAGE_TAR.tmp" "$IMAGE" && mv "$IMAGE_TAR.tmp" "$IMAGE_TAR"
fi

# ------------------------------------------------------------------------ containerd
cat > "$N/containerd.toml" <<TOML
version = 2
root = "$N/containerd"
state = "$RUN/state"
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # Nothing here may lower an oom_score_adj (runc: "failed to update /proc/self/oom_score_adj:
  # Permission denied" for the sandbox's -998): cap every container's at containerd's own.
  restrict_oom_score_adj = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "$(command -v runc)"
        Root = "$RUN/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$N/cni"
TOML
# One bridge on a private range; pods need no traffic beyond the node.
cat > "$N/cni/10-isthmus.conflist" <<JSON
{"cniVersion": "0.4.0", "name": "isthmus-node", "plugins": [
  {"type": "bridge", "bridge": "isthmus-cni0", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_SUBNET"}]], "dataDir": "$N/cni-ipam"}}]}
JSON
# Never `cmd | grep -q` under pipefail: grep exits at its first match, and the writer's SIGPIPE
# fails the pipeline (it did, in a CI run: an image "not in containerd" that was there).
lo_addrs=$(ip -o addr show dev lo)
grep -q " $NODE_IP/" <<< "$lo_addrs" || ip addr add "$NODE_IP/32" dev lo
start containerd containerd --config "$N/containerd.toml"
wait_until "containerd" ctr -a "$SOCK" version
ctrk() { ctr -a "$SOCK" -n k8s.io "$@"; }
has_image() { local refs; refs=$(ctrk images ls -q); grep -qx -- "$1" <<< "$refs"; }
for tar in "$PAUSE_TAR" "$IMAGE_TAR"; do
  ref=$([[ $tar == "$PAUSE_TAR" ]] && echo "$PAUSE_IMAGE" || echo "$IMAGE")
  if ! has_image "$ref"; then
    say "importing $ref into containerd"
    ctrk images import --no-unpack=false "$tar" > /dev/null
  fi
  has_image "$ref" || { say "$ref is not in containerd after the import"; exit 1; }
done

# ---------------------------------------------------------------------------- kubelet
P="$N/pki"
if [[ ! -f "$P/node.crt" ]]; then
  # Its client identity (the Node authorizer and NodeRestriction apply) and serving cert.
  printf '[c]\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n[s]\nsubjectAltName=IP:%s,DNS:%s\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' "$NODE_IP" "$NODE" > "$P/ext.cnf"
  openssl req -newkey rsa:2048 -nodes -subj "/O=system:nodes/CN=system:node:$NODE" -keyout "$P/node.key" -out "$P/node.csr" 2>/dev/null
  openssl x509 -req -in "$P/node.csr" -CA "$C/ca.crt" -CAkey "$C/ca.key" -CAcreateserial -days 3650 \
    -extfile "$P/ext.cnf" -extensions c -out "$P/node.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=$NODE" -keyout "$P/serving.key" -out "$P/serving.csr" 2>/dev/null
  openssl x509 -req -in "$P/serving.csr" -CA "$C/ca.crt" -CAkey "$C/ca.key" -CAcreateserial -days 3650 \
    -extfile "$P/ext.cnf" -extensions s -out "$P/serving.crt" 2>/dev/null
  rm -f "$P"/*.csr
fi
cat > "$N/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: isthmus-local
  cluster: {server: "$URL", certificate-authority: "$C/ca.crt"}
users:
- name: node
  user: {client-certificate: "$P/node.crt", client-key: "$P/node.key"}
contexts:
- name: node
  context: {cluster: isthmus-local, user: node}
current-context: node
KC
cat > "$N/kubelet.yaml" <<Y
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false          # this VM's kernel runs cgroup v1 (hybrid)
failSwapOn: false
cgroupDriver: cgroupfs       # no systemd here
containerRuntimeEndpoint: unix://$SOCK
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $HEALTHZ_PORT
tlsCertFile: $P/serving.crt
tlsPrivateKeyFile: $P/serving.key
# Only holders of a certificate of the stack's CA reach it (the API server, for pods/log);
# loopback only, so any such holder may do anything (no SubjectAccessReview round trip).
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $C/ca.crt}
authorization: {mode: AlwaysAllow}
registerNode: true
registerWithTaints: [{key: $TAINT_KEY, value: "true", effect: NoSchedule}]
maxPods: 16
resolvConf: ""
serializeImagePulls: false
imageGCHighThresholdPercent: 100   # its two images must never be collected: nothing can pull them again
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
evictionPressureTransitionPeriod: 10s
nodeStatusUpdateFrequency: 5s
syncFrequency: 10s
fileCheckFrequency: 10s
shutdownGracePeriod: 0s
Y
start kubelet "$KUBELET" --config "$N/kubelet.yaml" --kubeconfig "$N/kubeconfig" \
  --root-dir "$N/kubelet" --cert-dir "$P" --hostname-override "$NODE" --node-ip "$NODE_IP" \
  --node-labels "kubernetes.io/os=linux,isthmus.io/gpu=true,isthmus.io/real-node=true,$GPU_TYPE_LABEL=$PRODUCT" \
  --v=1
if ! wait_until "the kubelet's healthz" curl -sf --max-time 2 "http://127.0.0.1:$HEALTHZ_PORT/healthz"; then
  say "the kubelet did not start; its log's last lines:"; tail -25 "$N/logs/kubelet.log"; exit 1
fi
ready_cond() { api "$URL$1" | tr -d ' \n' | grep -q "\"type\":\"$2\",\"status\":\"True\"\|\"status\":\"True\",[^}]*\"type\":\"$2\""; }
if ! wait_until "node $NODE Ready" ready_cond "/api/v1/nodes/$NODE" Ready; then
  say "the kubelet did not make $NODE Ready; its log's last lines:"; tail -25 "$N/logs/kubelet.log"; exit 1
fi
# Two "GPUs": an extended resource on the node's status. The kubelet keeps an admin's
# extended resource and copies it to allocatable; without a device plugin it hands no device.
api -X PATCH "$URL/api/v1/nodes/$NODE/status" -H "Content-Type: application/json-patch+json" \
  --data "[{\"op\": \"add\", \"path\": \"/status/capacity/nvidia.com~1gpu\", \"value\": \"$GPUS\"}]" > /dev/null
alloc() { api "$URL/api/v1/nodes/$NODE" | tr -d ' \n' | grep -q "\"allocatable\":{[^}]*\"nvidia.com/gpu\":\"$GPUS\""; }
wait_until "$NODE allocatable nvidia.com/gpu=$GPUS" alloc

# ------------------------------------------------------------------------------ Kueue
cpu=$(api "$URL/api/v1/nodes/$NODE" | tr -d ' \n' | sed -n 's/.*"allocatable":{[^}]*"cpu":"\([0-9m]*\)".*/\1/p')
apply "/apis/kueue.x-k8s.io/v1beta2/resourceflavors/$FLAVOR" <<Y
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: $FLAVOR}
spec:
  nodeLabels: {$GPU_TYPE_LABEL: $PRODUCT}
  nodeTaints: [{key: $TAINT_KEY, value: "true", effect: NoSchedule}]
  tolerations: [{key: $TAINT_KEY, operator: Equal, value: "true", effect: NoSchedule}]
Y
apply "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/$CQ" <<Y
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: $CQ}
spec:
  namespaceSelector: {}
  queueingStrategy: BestEffortFIFO
  preemption: {withinClusterQueue: LowerPriority}
  resourceGroups:
  - coveredResources: [cpu, memory, nvidia.com/gpu]
    flavors:
    - name: $FLAVOR
      resources:
      - {name: cpu, nominalQuota: "${cpu:-2}"}
      - {name: memory, nominalQuota: 8Gi}
      - {name: nvidia.com/gpu, nominalQuota: "$GPUS"}
Y
for a in $ACCOUNTS; do
  apply "/apis/kueue.x-k8s.io/v1beta2/namespaces/$NS_PREFIX$a/localqueues/$LQ" <<Y
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {name: $LQ, namespace: $NS_PREFIX$a}
spec: {clusterQueue: $CQ}
Y
done
wait_until "ClusterQueue $CQ active" ready_cond "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/$CQ" Active
for a in $ACCOUNTS; do
  wait_until "LocalQueue $NS_PREFIX$a/$LQ active" ready_cond "/apis/kueue.x-k8s.io/v1beta2/namespaces/$NS_PREFIX$a/localqueues/$LQ" Active
done

cat > "$KSTATE/node.env" <<ENV
ISTHMUS_KUBE_NODE_NAME=$NODE
ISTHMUS_KUBE_NODE_CLUSTER_QUEUE=$CQ
ISTHMUS_KUBE_NODE_LOCAL_QUEUE=$LQ
ISTHMUS_KUBE_NODE_GPU_TYPE=$PRODUCT
ISTHMUS_KUBE_NODE_GPUS=$GPUS
ISTHMUS_KUBE_NODE_CPUS=${cpu:-2}
ISTHMUS_KUBE_NODE_IMAGE=$IMAGE
ISTHMUS_KUBE_NODE_UID_MAP=$(printf '%s\n' $STACK_USERS | tr : = | paste -sd,)
ENV
say "ready: $NODE runs real containers ($GPUS extended-resource GPUs, ClusterQueue $CQ)"
