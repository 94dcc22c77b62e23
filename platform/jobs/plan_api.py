"""REST API of the PaRO planner: what each strategy would take of memory and time for a model
and a layout, before any job is made."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from engine.paro.planner import DEFAULT_LINKS
from jobs import admission, calibration
from jobs.errors import BAD_QUERY, UNAUTHENTICATED
from jobs.serializers import PlanQuery, PlanSerializer


class PlanView(APIView):
    """PaRO planner predictions: every strategy's memory and step time for a model and a
    layout, best first (those that fit, fastest first; then the rest by memory)."""

    @extend_schema(parameters=[PlanQuery], responses={200: PlanSerializer, 400: BAD_QUERY,
                                                      401: UNAUTHENTICATED})
    def get(self, request: Request) -> Response:
        query = PlanQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        spec, budget = query.validated_data["spec"], query.validated_data["memory_budget_gb"] * 1e9
        rows, compute, priced = calibration.predict(spec, budget, DEFAULT_LINKS)
        t = spec.train
        tokens = t.micro_batch * t.seq_len * t.grad_accum * spec.parallel.world_size
        known = compute.time_s is not None
        return Response(PlanSerializer({
            "memory_budget_bytes": budget, "refused": admission.memory_refusal(spec), "plans": [
            {"strategy": r.strategy, "names": r.names, "fits": r.fits,
             "step_time_s": r.step_time_s if known else None,
             "compute_time_s": r.compute_time_s if known else None,
             "comm_time_s": r.comm_time_s,
             "tokens_per_s": tokens / r.step_time_s if known else None,
             "compute_source": compute.source, "link_source": priced.source,
             "memory_bytes": {"params": r.params_bytes, "grads": r.grads_bytes,
                              "optim": r.optim_bytes, "total": r.memory_bytes}}
            for r in rows]}).data)
