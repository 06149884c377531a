# The proxy as a container. Configure it with WIREPROXY_* environment variables
# (see wireproxy/config.py), e.g. WIREPROXY_UPSTREAM=mongodb://mongos:27017.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY mongoformats ./mongoformats
COPY simcluster ./simcluster
COPY wireproxy ./wireproxy
COPY buckets ./buckets
COPY bucketspark ./bucketspark
RUN pip install --no-cache-dir . && useradd --create-home --uid 10001 proxy
USER proxy
# numba's compiled kernels (mongoformats/byte_kernels.py) cached where this user may write, and
# made now: the proxy then starts in a fraction of a second instead of compiling them (~5 s).
ENV NUMBA_CACHE_DIR=/home/proxy/.cache/numba
RUN python -c "from mongoformats.batch_splice import warm_up; warm_up()"
ENV WIREPROXY_LISTEN_HOST=0.0.0.0 \
    WIREPROXY_LISTEN_PORT=27018 \
    WIREPROXY_METRICS_PORT=9108
EXPOSE 27018 9108
ENTRYPOINT ["wireproxy"]
