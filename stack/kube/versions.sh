# Versions of the local control plane (sourced by build.sh and up.sh).
K8S_VERSION="${K8S_VERSION:-v1.35.4}"        # Kueue v0.17.0 is built on k8s.io/* v0.35.3
KUEUE_VERSION="${KUEUE_VERSION:-v0.17.0}"
KWOK_VERSION="${KWOK_VERSION:-v0.7.0}"       # v0.7.0 fits k8s 0.35 libs; v0.8.0 needs 0.36 + controller-runtime 0.24
ETCD_DEB_SUITE="${ETCD_DEB_SUITE:-trixie}"    # Debian 13 ships etcd-server 3.5.x (kube-apiserver needs >= 3.5.13)
ETCD_GO_VERSION="${ETCD_GO_VERSION:-v3.6.16}" # fallback: build go.etcd.io/etcd/server/v3
