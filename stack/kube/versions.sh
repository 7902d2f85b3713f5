# Versions of the local control plane (sourced by build.sh and up.sh).
K8S_VERSION="${K8S_VERSION:-v1.35.4}"        # Kueue v0.17.0 is built on k8s.io/* v0.35.3
KUEUE_VERSION="${KUEUE_VERSION:-v0.17.0}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"       # built alone from its own go.mod (v0.7.0 does not compile against apimachinery v0.35)
ETCD_DEB_SUITE="${ETCD_DEB_SUITE:-trixie}"    # Debian 13 ships etcd-server 3.5.x (kube-apiserver needs >= 3.5.13)
ETCD_GO_VERSION="${ETCD_GO_VERSION:-v3.6.16}" # fallback: build go.etcd.io/etcd/server/v3
