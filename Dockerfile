# One image for every stepledger service (projector, recovery, CLI jobs).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY src ./src
# The daemons and the inbox: a service image carries every role but the development stack.
# The lake's image (docker-compose profile "lake") builds with EXTRAS=lake,recovery,inbox,registry.
ARG EXTRAS=projector,recovery,inbox,registry
RUN pip install --no-cache-dir ".[${EXTRAS}]"
VOLUME ["/data"]
ENTRYPOINT []
CMD ["stepledger", "--help"]
