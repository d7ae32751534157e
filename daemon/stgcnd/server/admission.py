"""Every reason a decoded `infer` or `push` is refused before it is queued (the model, the
array's shape, a camera slot), as a ProtocolError carrying the request's id; its queue's room
is the scheduler's to say."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from stgcnd.server.cameras import CameraState, CameraTable, Eviction
from stgcnd.server.models import ServedModel
from stgcnd_client.protocol import (
    ErrorCode,
    ProtocolError,
    Reason,
    Request,
    check_frame,
    check_window,
)


@dataclass
class Admitted:
    model: ServedModel
    camera: CameraState
    evicted: Eviction | None     # a camera that gave its slot to this one


def model_for(req: Request, models: Mapping[str, ServedModel]) -> ServedModel:
    """The request's model (nil: the first configured), or unknown-model."""
    if req.model is None:
        return next(iter(models.values()))
    model = models.get(req.model)
    if model is None:
        raise ProtocolError(ErrorCode.UNKNOWN_MODEL, f"no model named {req.model!r}; this "
                            f"daemon serves {', '.join(models)}", req.id)
    return model


def admit(req: Request, peer: str, received: float, models: Mapping[str, ServedModel],
          cameras: CameraTable) -> Admitted:
    """Admit an infer or push request, or raise the ProtocolError its client gets."""
    model = model_for(req, models)
    check = check_window if req.op == "infer" else check_frame
    try:
        check(req.arrays[0], model.input_shape)
    except ProtocolError as exc:  # the checks do not know the request id
        raise ProtocolError(exc.code, exc.message, req.id) from None
    cam, evicted = cameras.get(req.camera, received, peer)
    if cam is None:
        # Each camera holds a lane on every executor: a client inventing camera ids must not
        # exhaust them.
        raise ProtocolError(ErrorCode.BUSY, (
            f"this daemon already serves max_cameras={cameras.max_cameras} cameras and none "
            "of them can give way yet; retry in a few seconds or raise [server] max_cameras"),
            req.id, Reason.NO_CAMERA_SLOT)
    interval_s = model.config.min_interval_ms / 1e3
    if interval_s:
        last = cam.let_through.get(model.name)
        rec = cam.sent.get((req.op, model.name))
        if rec is None or rec.req_id != req.id:  # a resend: its first attempt was let through
            if last is not None and received - last < interval_s:
                raise ProtocolError(ErrorCode.BUSY, (
                    f"camera {cam.name!r} sent to model {model.name!r} "
                    f"{(received - last) * 1e3:.0f} ms after its last request let through; "
                    f"it takes one every min_interval_ms={model.config.min_interval_ms} ms "
                    "from a camera: send less often, or lower that [[models]] key"),
                    req.id, Reason.TOO_OFTEN)
            cam.let_through[model.name] = received
    return Admitted(model, cam, evicted)
