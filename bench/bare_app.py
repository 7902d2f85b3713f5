"""The reference: a bare FastAPI endpoint with no database and no auth, same server."""

from fastapi import Body, FastAPI

app = FastAPI()


@app.post("/v1/jobs", status_code=202)
def submit(body: dict = Body(...)) -> dict:
    return {"ok": True, "name": body.get("name")}


@app.get("/healthz")
def healthz() -> dict:
    return {"status": "ok"}
