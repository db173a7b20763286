# volume-agent image: the binary plus the filesystem tools it calls
# (mkfs/blkid/fsck for local block volumes, resize tools for expansion).
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /volume-agent ./cmd/volume-agent

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends e2fsprogs xfsprogs util-linux mount \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /volume-agent /usr/local/bin/volume-agent
ENTRYPOINT ["/usr/local/bin/volume-agent"]
