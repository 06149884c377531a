# The proxy as a container. Configure it with WIREPROXY_* environment variables
# (see wireproxy/config.py), e.g. WIREPROXY_UPSTREAM=mongodb://mongos:27017.
#
# It runs under any UID and on a read-only root filesystem, e.g.
#   docker run --user 12345 --read-only --tmpfs /tmp -e WIREPROXY_UPSTREAM=... IMAGE
# numba's compiled kernels are cached in NUMBA_CACHE_DIR when this user may write there, else in
# a folder of its own under /tmp, else not at all: the kernels are then compiled at each start,
# in the background while the proxy already serves (buckets/_columnar/numba_cache.py logs which).
FROM python:3.11-slim
# The base install only: the proxy (wireproxy, buckets, mongoformats), no simulator, no Spark.
COPY pyproject.toml README.md LICENSE /src/
COPY mongoformats /src/mongoformats
COPY wireproxy /src/wireproxy
COPY buckets /src/buckets
RUN pip install --no-cache-dir /src && rm -rf /src
# A numeric user with no home: as `--user` gives any other UID.
USER 10001:0
ENV NUMBA_CACHE_DIR=/tmp/numba-cache
# The kernels compiled now for the image's own user: its start needs no compile. Another UID
# cannot write this folder and compiles them once in a folder of its own.
RUN python -c "from buckets._columnar.batch_splice import warm_up; warm_up()"
ENV WIREPROXY_LISTEN_HOST=0.0.0.0 \
    WIREPROXY_LISTEN_PORT=27018 \
    WIREPROXY_METRICS_PORT=9108
EXPOSE 27018 9108
WORKDIR /
ENTRYPOINT ["wireproxy"]
