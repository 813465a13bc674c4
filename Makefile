# lbsvc-operator: kubebuilder-style Makefile. Every tool is pinned and built from the Go module proxy.
SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

K8S_VERSION        ?= v1.36.3
CONTROLLER_TOOLS   ?= v0.22.0
STATICCHECK        ?= v0.7.0
LBSVC_CACHE        ?= $(HOME)/.cache/lbsvc-operator
LOCALBIN           ?= $(CURDIR)/bin
TOOLBIN            ?= $(LOCALBIN)/tools
CONTROLLER_GEN     ?= $(TOOLBIN)/controller-gen-$(CONTROLLER_TOOLS)
STATICCHECK_BIN    ?= $(TOOLBIN)/staticcheck-$(STATICCHECK)
ENVTEST_ASSETS     ?= $(LBSVC_CACHE)/bin/$(K8S_VERSION)
GO_TEST_FLAGS      ?= -count=1

export LBSVC_CACHE K8S_VERSION

.PHONY: all
all: build

##@ Development

.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate CRDs and RBAC from kubebuilder markers.
	$(CONTROLLER_GEN) rbac:roleName=lbsvc-operator crd paths="./apis/...;./controllers/...;./cmd/..." \
		output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac
	hack/gen-chart.sh

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate deepcopy code.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths="./apis/..."

.PHONY: fmt
fmt:
	gofmt -w $$(git ls-files '*.go')

.PHONY: vet
vet:
	go vet ./...
	go vet -tags integration,dataplane,e2e,chart ./...

.PHONY: lint
lint: $(STATICCHECK_BIN) ## gofmt, go vet and staticcheck, all clean.
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(MAKE) vet
	$(STATICCHECK_BIN) ./...
	$(STATICCHECK_BIN) -tags integration,dataplane,e2e,chart ./...

.PHONY: verify-generated
verify-generated: manifests generate ## Fail when generated files are out of date.
	@git diff --exit-code -- config/crd config/rbac apis charts || { echo "generated files are stale: run make manifests generate"; exit 1; }
	@new=$$(git ls-files --others --exclude-standard -- config/crd config/rbac apis charts); \
		if [ -n "$$new" ]; then echo "generated files not in git:"; echo "$$new"; exit 1; fi

##@ Build

.PHONY: build
build: ## Build bin/lbsvc-operator and bin/lbpod (static).
	CGO_ENABLED=0 go build -trimpath -o $(LOCALBIN)/lbsvc-operator ./cmd/operator
	CGO_ENABLED=0 go build -trimpath -o $(LOCALBIN)/lbpod ./cmd/lbpod

.PHONY: images
images: build ## Build the operator, lb pod and backend images as OCI tarballs (no Docker needed).
	hack/images.sh

##@ Test

.PHONY: test
test: ## Everything: lint, unit, integration (envtest), data path (netns), e2e (local cluster).
	hack/test.sh all

.PHONY: test-unit
test-unit: ## Pure packages: allocator, builders, desired state, parsers.
	go test $(GO_TEST_FLAGS) ./...

.PHONY: test-integration
test-integration: envtest-assets ## Controllers against a real kube-apiserver and etcd.
	KUBEBUILDER_ASSETS=$(ENVTEST_ASSETS) go test $(GO_TEST_FLAGS) -tags integration -timeout 20m ./test/integration/... ./cmd/lbpod/...

.PHONY: test-chart
test-chart: ## helm lint --strict, and the chart rendered with default values against config/default.
	hack/test-chart.sh

.PHONY: test-dataplane
test-dataplane: ## lb pod data path in real network namespaces (root).
	go test $(GO_TEST_FLAGS) -tags dataplane -p 1 -timeout 20m ./test/dataplane/...

.PHONY: test-e2e
test-e2e: ## End-to-end on a local cluster (brought up and torn down around the tests).
	hack/test.sh e2e

.PHONY: fuzz
fuzz: ## Run each fuzz target for FUZZTIME (default 20s).
	hack/fuzz.sh $${FUZZTIME:-20s}

.PHONY: bench-dataplane
bench-dataplane: ## Data-path figures: throughput, connection rate, apply times.
	hack/bench-dataplane.sh

.PHONY: bench-operator
bench-operator: envtest-assets ## Time for 1000 Services to get an address, operator peak RSS.
	KUBEBUILDER_ASSETS=$(ENVTEST_ASSETS) hack/bench-operator.sh

.PHONY: envtest-assets
envtest-assets: ## Build kube-apiserver, etcd, kubectl for envtest from the Go module proxy (cached).
	hack/build-tools.sh envtest

##@ Demo

.PHONY: demo
demo: ## A local cluster with the operator and the seed's example working.
	hack/cluster/demo.sh up

.PHONY: demo-down
demo-down: ## Tear the demo cluster down, leaving nothing behind.
	hack/cluster/demo.sh down

$(CONTROLLER_GEN):
	mkdir -p $(TOOLBIN)
	GOBIN=$(TOOLBIN) go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_TOOLS)
	mv $(TOOLBIN)/controller-gen $@

$(STATICCHECK_BIN):
	mkdir -p $(TOOLBIN)
	GOBIN=$(TOOLBIN) go install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK)
	mv $(TOOLBIN)/staticcheck $@

.PHONY: help
help:
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_-]+:.*?##/ { printf "  %-20s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)
