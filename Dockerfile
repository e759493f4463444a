# One image for every koordbus process; the command picks the role (`service nodemetric`, `agent --apply`, `api` …).
# Build: docker build -t koordbus .   Used by docker-compose.yml and, later, the Helm chart.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY bus ./bus
COPY services ./services
COPY agent ./agent
COPY koordbus ./koordbus
COPY migrations ./migrations
RUN pip install . && rm -rf /src

# Services run unprivileged; the node agent is started as root by its deployment (it writes cgroup files).
USER 65532:65532
WORKDIR /var/lib/koordbus
ENTRYPOINT ["koordbus"]
CMD ["--help"]
