# The moongate image for users with a container engine (scripts/image.sh builds the same image
# without one, from Debian packages; that is the one the tests run).
#   docker build -t moongate:0.1.0 .
FROM debian:bookworm-slim AS build
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        cmake make gcc pkg-config protobuf-c-compiler protobuf-compiler libprotobuf-c-dev \
        libnghttp2-dev \
        libevent-dev libssl-dev libjansson-dev libibverbs-dev ca-certificates \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cmake -S . -B /build -DCMAKE_BUILD_TYPE=Release && cmake --build /build -j"$(nproc)" \
        --target moongate mgctl

FROM debian:bookworm-slim
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        libevent-2.1-7 libevent-extra-2.1-7 libevent-openssl-2.1-7 libevent-pthreads-2.1-7 \
        libnghttp2-14 libprotobuf-c1 libssl3 libjansson4 libibverbs1 ibverbs-providers \
        ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && echo 'moongate:x:65532:65532:moongate:/nonexistent:/usr/sbin/nologin' >>/etc/passwd \
    && echo 'moongate:x:65532:' >>/etc/group \
    && mkdir -p /run/moongate /etc/moongate && chown 65532:65532 /run/moongate
COPY --from=build /build/moongate /build/mgctl /usr/bin/
USER 65532:65532
EXPOSE 7443 7080 7446
ENTRYPOINT ["/usr/bin/moongate"]
