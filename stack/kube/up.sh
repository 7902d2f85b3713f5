#!/usr/bin/env bash
# Start the local Kubernetes control plane with Kueue and kwok fake GPU nodes, as plain
# processes (no container engine): etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, the Kueue manager and kwok. Idempotent: running processes are kept,
# objects are server-side applied. State (pids, logs, certs, data) under
# <repo>/.stack/kube/; connection settings in <repo>/.stack/kube/env.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
STATE="$REPO/.stack/kube"
CACHE="${ISTHMUS_CACHE:-/var/cache/isthmus}/kube"
source "$HERE/versions.sh"

API_PORT="${ISTHMUS_KUBE_API_PORT:-16443}"
ETCD_PORT="${ISTHMUS_KUBE_ETCD_PORT:-12379}"
WEBHOOK_PORT="${ISTHMUS_KUBE_WEBHOOK_PORT:-16446}"
KWOK_PORT="${ISTHMUS_KUBE_KWOK_PORT:-16447}"  # kwok's kubelet server (pods/log), kwok.sh
ACCOUNTS="${ISTHMUS_KUBE_ACCOUNTS:-team-a team-b team-c}"   # one namespace + LocalQueue each
NS_PREFIX="${ISTHMUS_KUBE_NS_PREFIX:-isthmus-}"
CLUSTER_QUEUE="${ISTHMUS_KUBE_CLUSTER_QUEUE:-isthmus-gpu}"
LOCAL_QUEUE="${ISTHMUS_KUBE_LOCAL_QUEUE:-isthmus}"
NODES="${ISTHMUS_KUBE_NODES:-4}"
GPUS_PER_NODE="${ISTHMUS_KUBE_GPUS_PER_NODE:-8}"
GPU_QUOTA="${ISTHMUS_KUBE_GPU_QUOTA:-32}"
# The nodes above are product A100_PRODUCT; a second pool on the same control plane has
# H100_NODES nodes of product H100_PRODUCT behind its own flavor, ClusterQueue and LocalQueue.
GPU_TYPE_LABEL="${ISTHMUS_KUBE_GPU_TYPE_LABEL:-nvidia.com/gpu.product}"
A100_PRODUCT="${ISTHMUS_KUBE_A100_PRODUCT:-a100}"
H100_PRODUCT="${ISTHMUS_KUBE_H100_PRODUCT:-h100}"
H100_NODES="${ISTHMUS_KUBE_H100_NODES:-2}"
H100_GPU_QUOTA="${ISTHMUS_KUBE_H100_GPU_QUOTA:-$((H100_NODES * GPUS_PER_NODE))}"
H100_CLUSTER_QUEUE="${ISTHMUS_KUBE_H100_CLUSTER_QUEUE:-isthmus-h100}"
H100_LOCAL_QUEUE="${ISTHMUS_KUBE_H100_LOCAL_QUEUE:-isthmus-h100}"
# A third pool for Kueue's Topology Aware Scheduling (docs/planning.md, "Topology"): RACK_NODES
# nodes of product RACK_PRODUCT, RACK_NODES_PER_RACK to a rack (node label RACK_LABEL), behind a
# flavor whose topologyName is the Topology TOPOLOGY (levels: rack, host). Its own nodes, flavor
# and queues: the other pools' placement and quota are unchanged.
RACK_PRODUCT="${ISTHMUS_KUBE_RACK_PRODUCT:-gh200}"
RACK_NODES="${ISTHMUS_KUBE_RACK_NODES:-4}"
RACK_NODES_PER_RACK="${ISTHMUS_KUBE_RACK_NODES_PER_RACK:-2}"
RACK_LABEL="${ISTHMUS_KUBE_RACK_LABEL:-topology.isthmus.io/topology-rack}"
RACK_GPU_QUOTA="${ISTHMUS_KUBE_RACK_GPU_QUOTA:-$((RACK_NODES * GPUS_PER_NODE))}"
RACK_CLUSTER_QUEUE="${ISTHMUS_KUBE_RACK_CLUSTER_QUEUE:-isthmus-rack}"
RACK_LOCAL_QUEUE="${ISTHMUS_KUBE_RACK_LOCAL_QUEUE:-isthmus-rack}"
TOPOLOGY="${ISTHMUS_KUBE_TOPOLOGY:-isthmus-racks}"
TIMEOUT_S="${ISTHMUS_KUBE_UP_TIMEOUT_S:-180}"

mkdir -p "$STATE"/{pids,logs,certs,kueue-certs}
say() { echo "[kube up] $*"; }

# Tools a fresh Debian 12 may lack.
need=(); for t in openssl curl; do command -v "$t" >/dev/null || need+=("$t"); done
if ((${#need[@]})); then apt-get update -qq && apt-get install -y -qq "${need[@]}"; fi

"$HERE/build.sh" > "$STATE/logs/build.log" 2>&1 || { tail -30 "$STATE/logs/build.log"; exit 1; }
bin() { echo "$CACHE/$1-$2/$1"; }
ETCD="$(ls -d "$CACHE"/etcd-*/etcd | tail -1)"
APISERVER="$(bin kube-apiserver "$K8S_VERSION")"; KCM="$(bin kube-controller-manager "$K8S_VERSION")"
SCHED="$(bin kube-scheduler "$K8S_VERSION")"; KUEUE="$(bin kueue "$KUEUE_VERSION")"; KWOK="$(bin kwok "$KWOK_VERSION")"
CRDS="$CACHE/kueue-$KUEUE_VERSION/crd"

# ------------------------------------------------------------------------ certs
C="$STATE/certs"
if [[ ! -f "$C/admin.crt" ]]; then
  say "generating CA and certificates"
  (
    cd "$C"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=isthmus-local-ca" \
      -keyout ca.key -out ca.crt 2>/dev/null
    cat > san.cnf <<SAN
[ext]
subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
[client]
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth
SAN
    openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" -keyout apiserver.key -out apiserver.csr 2>/dev/null
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile san.cnf -extensions ext -out apiserver.crt 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=isthmus-admin" -keyout admin.key -out admin.csr 2>/dev/null
    openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile san.cnf -extensions client -out admin.crt 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    rm -f ./*.csr
  )
fi
KUBECONFIG_FILE="$STATE/kubeconfig"
cat > "$KUBECONFIG_FILE" <<KC
apiVersion: v1
kind: Config
clusters:
- name: isthmus-local
  cluster: {server: "https://127.0.0.1:$API_PORT", certificate-authority: "$C/ca.crt"}
users:
- name: isthmus-admin
  user: {client-certificate: "$C/admin.crt", client-key: "$C/admin.key"}
contexts:
- name: isthmus-local
  context: {cluster: isthmus-local, user: isthmus-admin}
current-context: isthmus-local
KC

# -------------------------------------------------------------------- processes
alive() { [[ -f "$STATE/pids/$1.pid" ]] && kill -0 "$(cat "$STATE/pids/$1.pid")" 2>/dev/null; }
start() { # name cmd... ; keeps a running one
  local name=$1; shift
  if alive "$name"; then return 0; fi
  say "starting $name"
  setsid nohup "$@" >> "$STATE/logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$STATE/pids/$name.pid"
}
wait_until() { # description command...
  local what=$1; shift; local deadline=$((SECONDS + TIMEOUT_S))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS > deadline)); then say "timed out waiting for $what"; exit 1; fi
    sleep 0.5
  done
}
api() { curl -sS --fail --max-time 30 --cacert "$C/ca.crt" --cert "$C/admin.crt" --key "$C/admin.key" "$@"; }
URL="https://127.0.0.1:$API_PORT"
apply() { # api-path [file]; server-side apply, idempotent
  api -X PATCH "$URL$1?fieldManager=isthmus-stack&force=true" \
    -H "Content-Type: application/apply-patch+yaml" --data-binary @"${2:--}" > /dev/null
}

start etcd "$ETCD" --name default --data-dir "$STATE/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
  --initial-cluster "default=http://127.0.0.1:$((ETCD_PORT + 1))" \
  --listen-metrics-urls "http://127.0.0.1:$((ETCD_PORT + 2))" --unsafe-no-fsync
wait_until etcd curl -sf "http://127.0.0.1:$ETCD_PORT/health"

start kube-apiserver "$APISERVER" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
  --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$API_PORT" \
  --tls-cert-file "$C/apiserver.crt" --tls-private-key-file "$C/apiserver.key" \
  --client-ca-file "$C/ca.crt" --authorization-mode Node,RBAC \
  --service-account-key-file "$C/sa.pub" --service-account-signing-key-file "$C/sa.key" \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --service-cluster-ip-range 10.0.0.0/24 --allow-privileged=true --profiling=false \
  --kubelet-preferred-address-types InternalIP,Hostname \
  --kubelet-client-certificate "$C/admin.crt" --kubelet-client-key "$C/admin.key" \
  --cert-dir "$STATE/certs/apiserver-generated"
wait_until kube-apiserver api "$URL/readyz"

start kube-controller-manager "$KCM" --kubeconfig "$KUBECONFIG_FILE" \
  --authentication-kubeconfig "$KUBECONFIG_FILE" --authorization-kubeconfig "$KUBECONFIG_FILE" \
  --bind-address 127.0.0.1 --secure-port 16444 --leader-elect=false \
  --service-account-private-key-file "$C/sa.key" --root-ca-file "$C/ca.crt" \
  --cluster-signing-cert-file "$C/ca.crt" --cluster-signing-key-file "$C/ca.key" \
  --use-service-account-credentials=false --controllers '*' --concurrent-job-syncs 10 \
  --cert-dir "$STATE/certs/kcm-generated"
start kube-scheduler "$SCHED" --kubeconfig "$KUBECONFIG_FILE" \
  --authentication-kubeconfig "$KUBECONFIG_FILE" --authorization-kubeconfig "$KUBECONFIG_FILE" \
  --bind-address 127.0.0.1 --secure-port 16445 --leader-elect=false \
  --cert-dir "$STATE/certs/scheduler-generated"

# Kueue: CRDs, namespace, empty cert Secret and inert placeholder webhooks first (its
# internal cert manager fills the Secret and CA bundles; the webhooks stay inert).
for f in "$CRDS"/*.yaml; do
  name=$(awk '/^metadata:/{m=1} m && /^  name:/{print $2; exit}' "$f")
  if ! api "$URL/apis/apiextensions.k8s.io/v1/customresourcedefinitions/$name" >/dev/null 2>&1; then
    apply "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/$name" "$f"
  fi
done
# Kueue's cert rotator injects its CA into these CRDs' conversion webhooks and will not
# start its controllers until it could (Kueue's kustomize adds the same stanza). Only
# v1beta2, the storage version, is used, so the webhook is never called.
for crd in localqueues clusterqueues workloads cohorts multikueueclusters; do
  api -X PATCH "$URL/apis/apiextensions.k8s.io/v1/customresourcedefinitions/$crd.kueue.x-k8s.io?fieldManager=isthmus-stack-conversion&force=true" \
    -H "Content-Type: application/apply-patch+yaml" --data-binary @- > /dev/null <<Y
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: $crd.kueue.x-k8s.io}
spec:
  conversion:
    strategy: Webhook
    webhook:
      clientConfig: {service: {name: kueue-webhook-service, namespace: kueue-system, path: /convert}}
      conversionReviewVersions: [v1]
Y
done
apply /api/v1/namespaces/kueue-system <<Y
apiVersion: v1
kind: Namespace
metadata: {name: kueue-system}
Y
# The webhook Secret, pre-filled with a valid CA + serving cert: Kueue's rotator keeps a
# valid one ("no cert refresh needed") and finds the files in certDir at once, instead of
# polling with exponential backoff for minutes (in a pod the Secret is a mounted volume).
KW="$C/kueue-webhook"
if [[ ! -f "$KW/tls.crt" ]]; then
  mkdir -p "$KW"
  # PKCS#1 keys: the rotator parses them with x509.ParsePKCS1PrivateKey.
  openssl genrsa -traditional -out "$KW/ca.key" 2048 2>/dev/null
  openssl genrsa -traditional -out "$KW/tls.key" 2048 2>/dev/null
  openssl req -x509 -new -key "$KW/ca.key" -days 3650 -subj "/O=kueue/CN=kueue-ca" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,digitalSignature" \
    -out "$KW/ca.crt" 2>/dev/null
  openssl req -new -key "$KW/tls.key" -subj "/CN=kueue-webhook-service.kueue-system.svc" -out "$KW/tls.csr" 2>/dev/null
  printf 'subjectAltName=DNS:kueue-webhook-service.kueue-system.svc\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n' > "$KW/ext.cnf"
  openssl x509 -req -in "$KW/tls.csr" -CA "$KW/ca.crt" -CAkey "$KW/ca.key" -CAcreateserial -days 3650 \
    -extfile "$KW/ext.cnf" -out "$KW/tls.crt" 2>/dev/null
fi
apply /api/v1/namespaces/kueue-system/secrets/kueue-webhook-server-cert <<Y
apiVersion: v1
kind: Secret
metadata: {name: kueue-webhook-server-cert, namespace: kueue-system}
data:
  ca.crt: $(base64 -w0 < "$KW/ca.crt")
  ca.key: $(base64 -w0 < "$KW/ca.key")
  tls.crt: $(base64 -w0 < "$KW/tls.crt")
  tls.key: $(base64 -w0 < "$KW/tls.key")
Y
cp "$KW/ca.crt" "$KW/tls.crt" "$KW/tls.key" "$STATE/kueue-certs/"
for kind in validating mutating; do
  K=$([[ $kind == validating ]] && echo ValidatingWebhookConfiguration || echo MutatingWebhookConfiguration)
  apply "/apis/admissionregistration.k8s.io/v1/${kind}webhookconfigurations/kueue-$kind-webhook-configuration" <<Y
apiVersion: admissionregistration.k8s.io/v1
kind: $K
metadata: {name: kueue-$kind-webhook-configuration}
webhooks:
- name: placeholder.kueue.x-k8s.io
  clientConfig: {service: {name: kueue-webhook-service, namespace: kueue-system, path: /placeholder}}
  rules: []
  failurePolicy: Ignore
  sideEffects: None
  admissionReviewVersions: [v1]
Y
done
for f in "$CRDS"/*.yaml; do
  name=$(awk '/^metadata:/{m=1} m && /^  name:/{print $2; exit}' "$f")
  wait_until "CRD $name" bash -c "curl -sf --cacert '$C/ca.crt' --cert '$C/admin.crt' --key '$C/admin.key' \
    '$URL/apis/apiextensions.k8s.io/v1/customresourcedefinitions/$name' | grep -q '\"type\": \"Established\",\s*\"status\": \"True\"' \
    || curl -sf --cacert '$C/ca.crt' --cert '$C/admin.crt' --key '$C/admin.key' \
    '$URL/apis/apiextensions.k8s.io/v1/customresourcedefinitions/$name' | tr -d ' \n' | grep -q '\"type\":\"Established\",\"status\":\"True\"'"
done

cat > "$STATE/kueue-config.yaml" <<Y
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health: {healthProbeBindAddress: "0"}
metrics: {bindAddress: "0"}
webhook: {port: $WEBHOOK_PORT, certDir: "$STATE/kueue-certs"}
leaderElection: {leaderElect: false}
internalCertManagement: {enable: true}
integrations: {frameworks: ["batch/job"]}
Y
start kueue env KUBECONFIG="$KUBECONFIG_FILE" "$KUEUE" --config="$STATE/kueue-config.yaml" --zap-log-level=info \
  --feature-gates=VisibilityOnDemand=false  # its API server wants in-cluster delegated auth
# kwok, with its kubelet server for pods/log (kwok.sh; restarts a kwok started without it).
ISTHMUS_KUBE_STATE="$STATE" ISTHMUS_KUBE_KWOK_PORT="$KWOK_PORT" "$HERE/kwok.sh"

# ---------------------------------------------------------------------- objects
gpu_node() { # name product [extra labels, "key: value, ..."]
  local n=$1 product=$2 extra=${3:+, $3}
  apply "/api/v1/nodes/$n" <<Y
apiVersion: v1
kind: Node
metadata:
  name: $n
  annotations: {kwok.x-k8s.io/node: fake, node.alpha.kubernetes.io/ttl: "0"}
  labels: {kubernetes.io/hostname: $n, kubernetes.io/os: linux, kubernetes.io/arch: amd64, type: kwok, isthmus.io/gpu: "true",
           $GPU_TYPE_LABEL: $product$extra}
Y
  node_status "$n"
}
node_status() { # name: capacity, addresses and kubelet endpoint (again after Ready: see below)
  local n=$1
  apply "/api/v1/nodes/$n/status" <<Y
apiVersion: v1
kind: Node
metadata: {name: $n}
status:
  capacity: {cpu: "32", memory: 256Gi, pods: "110", nvidia.com/gpu: "$GPUS_PER_NODE"}
  allocatable: {cpu: "32", memory: 256Gi, pods: "110", nvidia.com/gpu: "$GPUS_PER_NODE"}
  # The apiserver proxies pods/log to the node's kubelet: kwok's server on loopback. Its
  # addresses are both 127.0.0.1 (--kubelet-preferred-address-types InternalIP,Hostname).
  addresses: [{type: InternalIP, address: 127.0.0.1}, {type: Hostname, address: 127.0.0.1}]
  daemonEndpoints: {kubeletEndpoint: {Port: $KWOK_PORT}}
Y
}
for i in $(seq 1 "$NODES"); do gpu_node "kwok-gpu-$i" "$A100_PRODUCT"; done
for i in $(seq 1 "$H100_NODES"); do gpu_node "kwok-h100-$i" "$H100_PRODUCT"; done
for i in $(seq 1 "$RACK_NODES"); do
  gpu_node "kwok-rack-$i" "$RACK_PRODUCT" "$RACK_LABEL: r$(( (i - 1) / RACK_NODES_PER_RACK + 1 ))"
done

# One flavor per GPU product, selecting its nodes by the product label (Kueue adds the
# label to the admitted pods' nodeSelector), and one ClusterQueue per flavor: two pools.
pool_objects() { # flavor product cluster-queue nodes gpu-quota [topology]
  local flavor=$1 product=$2 cq=$3 nodes=$4 quota=$5 topology=${6:+, topologyName: $6}
  apply "/apis/kueue.x-k8s.io/v1beta2/resourceflavors/$flavor" <<Y
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: $flavor}
spec: {nodeLabels: {$GPU_TYPE_LABEL: $product}$topology}
Y
  apply "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/$cq" <<Y
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: $cq}
spec:
  namespaceSelector: {}
  queueingStrategy: BestEffortFIFO
  preemption: {withinClusterQueue: LowerPriority}
  resourceGroups:
  - coveredResources: [cpu, memory, nvidia.com/gpu]
    flavors:
    - name: $flavor
      resources:
      - {name: cpu, nominalQuota: "$((nodes * 32))"}
      - {name: memory, nominalQuota: "$((nodes * 256))Gi"}
      - {name: nvidia.com/gpu, nominalQuota: "$quota"}
Y
}
pool_objects isthmus-gpu-flavor "$A100_PRODUCT" "$CLUSTER_QUEUE" "$NODES" "$GPU_QUOTA"
pool_objects isthmus-h100-flavor "$H100_PRODUCT" "$H100_CLUSTER_QUEUE" "$H100_NODES" "$H100_GPU_QUOTA"
# TAS: the Topology (levels are node labels, highest first; the hostname level lets Kueue name
# each pod's node), then the third pool's flavor that names it.
apply "/apis/kueue.x-k8s.io/v1beta2/topologies/$TOPOLOGY" <<Y
apiVersion: kueue.x-k8s.io/v1beta2
kind: Topology
metadata: {name: $TOPOLOGY}
spec:
  levels:
  - {nodeLabel: $RACK_LABEL}
  - {nodeLabel: kubernetes.io/hostname}
Y
pool_objects isthmus-rack-flavor "$RACK_PRODUCT" "$RACK_CLUSTER_QUEUE" "$RACK_NODES" "$RACK_GPU_QUOTA" "$TOPOLOGY"
# The gateway's priority levels (adapter default mapping: <0 low, 0 normal, >0 high).
for pc in "isthmus-low 100" "isthmus-normal 1000" "isthmus-high 10000"; do
  set -- $pc
  apply "/apis/kueue.x-k8s.io/v1beta2/workloadpriorityclasses/$1" <<Y
apiVersion: kueue.x-k8s.io/v1beta2
kind: WorkloadPriorityClass
metadata: {name: $1}
value: $2
description: "Isthmus gateway priority level $1"
Y
done
namespaces=()
for a in $ACCOUNTS; do
  ns="$NS_PREFIX$a"; namespaces+=("$ns")
  apply "/api/v1/namespaces/$ns" <<Y
apiVersion: v1
kind: Namespace
metadata: {name: $ns, labels: {isthmus.io/account: $a}}
Y
  for lq in "$LOCAL_QUEUE:$CLUSTER_QUEUE" "$H100_LOCAL_QUEUE:$H100_CLUSTER_QUEUE" "$RACK_LOCAL_QUEUE:$RACK_CLUSTER_QUEUE"; do
    apply "/apis/kueue.x-k8s.io/v1beta2/namespaces/$ns/localqueues/${lq%%:*}" <<Y
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {name: ${lq%%:*}, namespace: $ns}
spec: {clusterQueue: ${lq#*:}}
Y
  done
done

# ---------------------------------------------------------------------- readiness
ready_cond() { api "$URL$1" | tr -d ' \n' | grep -q "\"type\":\"$2\",\"status\":\"True\"\|\"status\":\"True\",[^}]*\"type\":\"$2\""; }
export -f ready_cond api; export URL C
# kwok's node-initialize stage, when it reads a node before the status above is set, writes
# its own --node-ip (10.243.0.1) over the InternalIP: a race at start-up that left one fake
# node whose pods/log the apiserver sent nowhere (CI 877d2df: three log tests failed, 404).
# Once a node is Ready kwok no longer touches its addresses: set them again, then check.
loopback_ip() { api "$URL/api/v1/nodes/$1" | tr -d ' \n' | grep -q '"type":"InternalIP","address":"127.0.0.1"\|"address":"127.0.0.1","type":"InternalIP"'; }
export -f loopback_ip
for n in $(seq -f kwok-gpu-%g 1 "$NODES") $(seq -f kwok-h100-%g 1 "$H100_NODES") $(seq -f kwok-rack-%g 1 "$RACK_NODES"); do
  wait_until "node $n Ready" ready_cond "/api/v1/nodes/$n" Ready
  node_status "$n"
  wait_until "node $n's InternalIP 127.0.0.1 (kwok's server)" loopback_ip "$n"
done
for cq in "$CLUSTER_QUEUE" "$H100_CLUSTER_QUEUE" "$RACK_CLUSTER_QUEUE"; do
  wait_until "ClusterQueue $cq active" ready_cond "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/$cq" Active
done
for ns in "${namespaces[@]}"; do
  for lq in "$LOCAL_QUEUE" "$H100_LOCAL_QUEUE" "$RACK_LOCAL_QUEUE"; do
    wait_until "LocalQueue $ns/$lq active" ready_cond "/apis/kueue.x-k8s.io/v1beta2/namespaces/$ns/localqueues/$lq" Active
  done
  wait_until "ServiceAccount $ns/default" api "$URL/api/v1/namespaces/$ns/serviceaccounts/default"
done

cat > "$STATE/env" <<ENV
KUBECONFIG=$KUBECONFIG_FILE
ISTHMUS_KUBE_API=$URL
ISTHMUS_KUBE_CLUSTER_QUEUE=$CLUSTER_QUEUE
ISTHMUS_KUBE_LOCAL_QUEUE=$LOCAL_QUEUE
ISTHMUS_KUBE_NAMESPACE_TEMPLATE=${NS_PREFIX}{account}
ISTHMUS_KUBE_ACCOUNTS=$(echo $ACCOUNTS | tr ' ' ',')
ISTHMUS_KUBE_NAMESPACES=$(IFS=,; echo "${namespaces[*]}")
ISTHMUS_KUBE_PRIORITY_CLASSES=-1:isthmus-low,0:isthmus-normal,1:isthmus-high
ISTHMUS_KUBE_NODES=$NODES
ISTHMUS_KUBE_GPUS_PER_NODE=$GPUS_PER_NODE
ISTHMUS_KUBE_GPU_QUOTA=$GPU_QUOTA
ISTHMUS_KUBE_STATE_DIR=$STATE
ISTHMUS_KUBE_CONTAINER_OUTPUT_DIR=$STATE/container-output
ISTHMUS_KUBE_GPU_TYPE_LABEL=$GPU_TYPE_LABEL
ISTHMUS_KUBE_GPU_TYPE=$A100_PRODUCT
ISTHMUS_KUBE_H100_CLUSTER_QUEUE=$H100_CLUSTER_QUEUE
ISTHMUS_KUBE_H100_LOCAL_QUEUE=$H100_LOCAL_QUEUE
ISTHMUS_KUBE_H100_GPU_TYPE=$H100_PRODUCT
ISTHMUS_KUBE_H100_NODES=$H100_NODES
ISTHMUS_KUBE_H100_GPU_QUOTA=$H100_GPU_QUOTA
ISTHMUS_KUBE_RACK_CLUSTER_QUEUE=$RACK_CLUSTER_QUEUE
ISTHMUS_KUBE_RACK_LOCAL_QUEUE=$RACK_LOCAL_QUEUE
ISTHMUS_KUBE_RACK_GPU_TYPE=$RACK_PRODUCT
ISTHMUS_KUBE_RACK_NODES=$RACK_NODES
ISTHMUS_KUBE_RACK_NODES_PER_RACK=$RACK_NODES_PER_RACK
ISTHMUS_KUBE_RACK_LABEL=$RACK_LABEL
ENV
say "ready: $URL (env: $STATE/env)"
