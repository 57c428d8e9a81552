"""What both HTTP edges share: orjson responses and bounded bodies, the shape checks at the edge,
uvicorn servers, TLS that follows its files, certificates, and JSON Patch."""
