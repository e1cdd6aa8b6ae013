# One image for every stepledger service (projector, recovery, CLI jobs).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY src ./src
# The daemons and the inbox: a service image carries every role but the development stack.
RUN pip install --no-cache-dir '.[projector,recovery,inbox,registry]'
VOLUME ["/data"]
ENTRYPOINT []
CMD ["stepledger", "--help"]
