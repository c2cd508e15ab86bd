# The flowwarden connector with the examples, for docker-compose.yml's `connector` service.
# No Java and no Spark: a handler with @on_dataframe needs an image with Java 17 and
# `pip install "flowwarden[spark]"`.
FROM python:3.12-slim

COPY . /src
RUN pip install --no-cache-dir /src && cp -r /src/examples /app && rm -rf /src

WORKDIR /app
USER nobody
ENTRYPOINT ["flowwarden"]
CMD ["--help"]
