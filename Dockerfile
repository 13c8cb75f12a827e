# celeriac worker image (Debian 12). Build: docker build -t celeriac .
FROM debian:12-slim AS build
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        gcc make pkg-config librabbitmq-dev libcurl4-openssl-dev libcjson-dev libhiredis-dev \
        libuv1-dev libwebsockets-dev libpcre2-dev zlib1g-dev ca-certificates \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN make -j"$(nproc)" all

FROM debian:12-slim
# One package per library the binary links (its NEEDED entries; the rest come as
# their dependencies) and per plugin it loads at run time:
# libwebsockets 4 serves on the libuv loop through a plugin it dlopens
# (libwebsockets-evlib_uv.so), which no package here depends on, so without
# libwebsockets-evlib-uv the gateway and --metrics-port cannot start.
# tests/integration/test_packaging.py derives this list on a Debian 12 host and
# fails when a library is missing from it.
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        librabbitmq4 libcurl4 libcjson1 libhiredis0.14 libuv1 libwebsockets17 \
        libwebsockets-evlib-uv libpcre2-8-0 libssl3 zlib1g ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/build/celeriac /usr/local/bin/celeriac
USER nobody
ENTRYPOINT ["/usr/local/bin/celeriac"]
CMD ["worker"]
