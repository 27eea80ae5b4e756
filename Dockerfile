# syntax=docker/dockerfile:1
# gpu-device-plugin container image. `make image` assembles the same
# layout without a container engine (tools/imagebuild); a test keeps the
# two in step.
#
# Build args:
#   VERSION      stamped into the binaries and org.opencontainers.image.version (default dev;
#                make -s version prints the Makefile's, from the VERSION file)
#   COMMIT       stamped into the binaries and org.opencontainers.image.revision (default unknown)
#   GO_VERSION   the golang image the binaries are built in (default 1.26.8)
#   BASE_IMAGE   the runtime base: any glibc >= 2.34 image (default distroless base-debian12)
#   LICENSE      org.opencontainers.image.licenses (default Apache-2.0)
#
#   docker build --build-arg VERSION=$(make -s version) \
#                --build-arg COMMIT=$(git rev-parse --short HEAD) -t gpu-device-plugin .
ARG GO_VERSION=1.26.8
ARG BASE_IMAGE=gcr.io/distroless/base-debian12:latest

FROM golang:${GO_VERSION}-bookworm AS build
# pci.ids names NICs for the NIC discovery (ghw); Debian ships it alone.
RUN apt-get update \
 && apt-get install -y --no-install-recommends pci.ids \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=unknown
# The Makefile's build: cgo (go-nvml dlopens libnvidia-ml.so.1), -trimpath,
# its GOTAGS, version and commit through -X.
ENV CGO_ENABLED=1 CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations"
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -tags urfave_cli_no_docs,grpcnotrace -ldflags "-X main.version=${VERSION} -X main.commit=${COMMIT}" \
      -o /out/gpu-device-plugin ./cmd/gpu-device-plugin
# The daemons of device-plugin and DRA mode, built the same way but without
# DWARF (as make does); serve execs them from its own directory, so they
# are copied beside the plugin.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -tags urfave_cli_no_docs,grpcnotrace -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT}" \
      -o /out/gpu-device-plugin-dp ./cmd/gpu-device-plugin-dp
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -tags urfave_cli_no_docs,grpcnotrace -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT}" \
      -o /out/gpu-device-plugin-dra ./cmd/gpu-device-plugin-dra
# The ComputeDomain controller, run by the chart's Deployment, built as the
# daemons are; gpu-device-plugin-dra compute-domain-controller execs it
# from beside itself.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -tags urfave_cli_no_docs,grpcnotrace -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT}" \
      -o /out/gpu-device-plugin-controller ./cmd/gpu-device-plugin-controller
# The CDI hook, static: the chart's init container copies it onto the host,
# where the container runtime runs it whatever the host's libc.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags "-X main.version=${VERSION} -X main.commit=${COMMIT}" \
      -o /out/gpu-device-plugin-cdi-hook ./cmd/gpu-device-plugin-cdi-hook

# distroless base has glibc with libm, libpthread, libdl and librt, which
# the driver's libnvidia-ml.so.1 links against, and nothing else.
FROM ${BASE_IMAGE}
ARG VERSION=dev
ARG COMMIT=unknown
ARG LICENSE=Apache-2.0
COPY --from=build /out/gpu-device-plugin /usr/bin/gpu-device-plugin
COPY --from=build /out/gpu-device-plugin-dp /usr/bin/gpu-device-plugin-dp
COPY --from=build /out/gpu-device-plugin-dra /usr/bin/gpu-device-plugin-dra
COPY --from=build /out/gpu-device-plugin-controller /usr/bin/gpu-device-plugin-controller
COPY --from=build /out/gpu-device-plugin-cdi-hook /usr/bin/gpu-device-plugin-cdi-hook
COPY --from=build /usr/share/misc/pci.ids /usr/share/misc/pci.ids
LABEL org.opencontainers.image.title="gpu-device-plugin" \
      org.opencontainers.image.description="Kubernetes device plugin for NVIDIA GPUs" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${COMMIT}" \
      org.opencontainers.image.source="https://github.com/gpu-device-plugin/gpu-device-plugin" \
      org.opencontainers.image.licenses="${LICENSE}"
# Root: the plugin creates its socket in the kubelet's root-owned
# device-plugin directory and NVML opens /dev/nvidia*. The pod spec, not
# the image, decides privileges (deploy/).
USER 0:0
ENTRYPOINT ["/usr/bin/gpu-device-plugin"]
CMD ["serve"]
