"""Per-client privacy ledgers: the stateful wrapper around dp_accounting.

Mechanisms describe what they did as ``DpEvent`` values; a :class:`PrivacyLedger` composes them for one client
and refuses any event that is unsupported or would overspend the client's :class:`Budget`. Every refusal
happens *before* any state changes (check, then mutate): a refused event leaves the ledger exactly as it was.
:class:`LedgerBook` holds one ledger per client, so heterogeneous budgets need no special path, and charges a
whole round all-or-nothing.

Example:
  >>> from trustfl.privacy.events import gaussian_event, poisson_sampled
  >>> ledger = PrivacyLedger(0, Budget(epsilon=2.0, delta=1e-5))
  >>> ledger.compose(poisson_sampled(gaussian_event(1.0), 0.01), count=100)
  >>> 0 < ledger.epsilon_spent() < 2.0
  True
"""
from __future__ import annotations

import copy
import math
import numbers
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional

from trustfl.core.checks import check_number
from trustfl.errors import BudgetExceededError, CheckpointError, PrivacyError, UnsupportedEventError
from trustfl.privacy.analysis.gaussian import ACCOUNTANTS, NEIGHBORINGS, make_accountant
from trustfl.privacy.events import describe, event_from_dict

if TYPE_CHECKING:  # dp_accounting is imported where it is used (a run without ledgers never imports it)
    from dp_accounting import privacy_accountant as dpa_accountant
    from dp_accounting.dp_event import DpEvent

__all__ = ["Budget", "LedgerBook", "PrivacyLedger", "check_schedule"]

_SLACK = 1e-9  # relative; absorbs float noise when a schedule was calibrated to exactly the budget


@dataclass(frozen=True)
class Budget:
    """A client's (ε, δ) privacy budget; ``epsilon = math.inf`` means no budget (track only)."""

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        eps, delta = self.epsilon, self.delta
        if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not eps > 0:
            raise PrivacyError(f"`epsilon` budget must be > 0 (math.inf for no budget), found {eps!r}.")
        if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not 0.0 < delta < 1.0:
            raise PrivacyError(f"`delta` budget must be in (0, 1), found {delta!r}.")
        object.__setattr__(self, "epsilon", float(eps))
        object.__setattr__(self, "delta", float(delta))

    @property
    def unlimited(self) -> bool:
        return math.isinf(self.epsilon)

    def allows(self, epsilon: float) -> bool:
        """Whether spending ``epsilon`` (at this δ) stays within the budget."""
        return self.unlimited or epsilon <= self.epsilon * (1.0 + _SLACK)


def _check_accounting(accountant: object, neighboring: object) -> None:
    if not isinstance(accountant, str) or accountant not in ACCOUNTANTS:
        raise PrivacyError(f"`accountant` must be one of {ACCOUNTANTS}, found {accountant!r}.")
    if not isinstance(neighboring, str) or neighboring not in NEIGHBORINGS:
        raise PrivacyError(f"`neighboring` must be one of {sorted(NEIGHBORINGS)}, found {neighboring!r}.")


def _check_client_id(client_id: Any) -> int:
    """``client_id`` as an int: a Python or NumPy integer (PrivacyError naming it otherwise)."""
    return int(check_number("client_id", client_id, integer=True, error=PrivacyError))


def _check_count(count: int) -> int:
    return int(check_number("count", count, integer=True, low=0, error=PrivacyError))


def _unsupported_message(acc: dpa_accountant.PrivacyAccountant, event: DpEvent) -> str:
    """dp_accounting's own explanation (it names the offending sub-event), from a throw-away accountant."""
    from dp_accounting import privacy_accountant as dpa_accountant

    try:
        copy.deepcopy(acc).compose(event)
    except dpa_accountant.UnsupportedEventError as exc:
        return str(exc)
    return f"Unsupported event {event!r}."


def _fmt_eps(eps: float) -> str:
    return f"{eps:.3g}" if math.isfinite(eps) else "inf"


class PrivacyLedger:
    """The privacy spent by one client: a dp_accounting accountant plus the list of composed events.

    Args:
      client_id: the client this ledger belongs to (an integer; named in errors).
      budget: the client's (ε, δ) budget; ε is reported at ``budget.delta``.
      accountant: ``"rdp"`` (dp_accounting defaults) or ``"pld"`` (value discretization 1e-4).
      neighboring: ``"add_remove"`` (default; Poisson sampling) or ``"replace_one"`` (needed by
        ``SampledWithoutReplacementDpEvent``).
    """

    def __init__(self, client_id: int, budget: Budget, accountant: str = "rdp",
                 neighboring: str = "add_remove") -> None:
        client_id = _check_client_id(client_id)
        if not isinstance(budget, Budget):
            raise PrivacyError(f"`budget` must be a Budget, found {type(budget).__name__}.")
        _check_accounting(accountant, neighboring)
        self.client_id = client_id
        self.budget = budget
        self.accountant = accountant
        self.neighboring = neighboring
        self._accountant: Optional[dpa_accountant.PrivacyAccountant] = None  # made at first use (dp_accounting)
        self._history: list[tuple[DpEvent, int]] = []
        self._epsilon: Optional[float] = 0.0

    @property
    def _acc(self) -> dpa_accountant.PrivacyAccountant:
        """The dp_accounting accountant, made at first use: a ledger built and never charged (a deployed node's)
        does not import dp_accounting."""
        if self._accountant is None:
            self._accountant = make_accountant(self.accountant, self.neighboring)
        return self._accountant

    @_acc.setter
    def _acc(self, acc: dpa_accountant.PrivacyAccountant) -> None:
        self._accountant = acc

    # -- checks (never mutate) -------------------------------------------------------------------------------
    def supports(self, event: DpEvent) -> bool:
        """Whether this ledger's accountant can compose ``event`` (recursively)."""
        from dp_accounting.dp_event import DpEvent

        return isinstance(event, DpEvent) and self._acc.supports(event)

    def _require_supported(self, event: DpEvent) -> None:
        from dp_accounting.dp_event import DpEvent

        if not isinstance(event, DpEvent):
            raise UnsupportedEventError(f"client {self.client_id}: expected a DpEvent, found "
                                        f"{type(event).__name__}.")
        if not self._acc.supports(event):
            raise UnsupportedEventError(f"client {self.client_id}: the {self.accountant} accountant "
                                        f"({self.neighboring}) cannot compose this event; the ledger is unchanged. "
                                        f"{_unsupported_message(self._acc, event)}")

    def _trial(self, event: DpEvent, count: int) -> tuple[dpa_accountant.PrivacyAccountant, float]:
        """A copy of the accountant with ``event`` composed, and its ε at the budget's δ."""
        trial = copy.deepcopy(self._acc)
        trial.compose(event, count)
        return trial, float(trial.get_epsilon(self.budget.delta))

    def would_exceed(self, event: DpEvent, count: int = 1) -> bool:
        """Whether composing ``event`` ``count`` times would overspend the budget (the ledger is not changed).

        Raises:
          UnsupportedEventError: the event cannot be composed.
        """
        self._require_supported(event)
        if self.budget.unlimited:
            return False
        return not self.budget.allows(self._trial(event, _check_count(count))[1])

    # -- mutation --------------------------------------------------------------------------------------------
    def compose(self, event: DpEvent, count: int = 1) -> None:
        """Record ``count`` applications of ``event``.

        Raises:
          UnsupportedEventError: the accountant cannot compose ``event`` (names the sub-event).
          BudgetExceededError: composing would spend more than the budget (names client, budget and the spend).
          In both cases the ledger is left untouched.
        """
        self._require_supported(event)
        count = _check_count(count)
        if self.budget.unlimited:
            self._acc.compose(event, count)
            self._epsilon = None
        else:
            trial, eps = self._trial(event, count)
            if not self.budget.allows(eps):
                raise BudgetExceededError(
                    f"client {self.client_id}: composing {describe(event)['type']} x{count} would spend "
                    f"ε = {_fmt_eps(eps)} at δ = {self.budget.delta:g}, over its budget ε = {self.budget.epsilon!r} "
                    f"(spent so far ε = {_fmt_eps(self.epsilon_spent())}); the ledger is unchanged.")
            self._acc, self._epsilon = trial, eps
        self._history.append((event, count))

    def _commit(self, trial: dpa_accountant.PrivacyAccountant, eps: Optional[float],
                entries: list[tuple[DpEvent, int]]) -> None:
        self._acc, self._epsilon = trial, eps
        self._history.extend(entries)

    # -- queries ---------------------------------------------------------------------------------------------
    def epsilon_spent(self) -> float:
        """ε spent so far at ``budget.delta`` (0 when nothing was composed)."""
        if self._epsilon is None:
            self._epsilon = float(self._acc.get_epsilon(self.budget.delta)) if self._history else 0.0
        return self._epsilon

    @property
    def events(self) -> list[tuple[DpEvent, int]]:
        """The composed (event, count) pairs, oldest first."""
        return list(self._history)

    # -- checkpointing ---------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """A JSON-serialisable state: configuration and the composed events (recomposed on load)."""
        return {"client_id": self.client_id, "budget": {"epsilon": self.budget.epsilon, "delta": self.budget.delta},
                "accountant": self.accountant, "neighboring": self.neighboring,
                "events": [{"event": describe(ev), "count": n} for ev, n in self._history]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output by recomposing its events in order (budget is not re-checked).

        Raises:
          CheckpointError: the state belongs to another client or accountant, or is corrupt.
        """
        from dp_accounting import privacy_accountant as dpa_accountant

        try:
            if int(state["client_id"]) != self.client_id:
                raise CheckpointError(f"Ledger state is for client {state['client_id']}, not {self.client_id}.")
            if state["accountant"] != self.accountant or state.get("neighboring", "add_remove") != self.neighboring:
                raise CheckpointError(f"client {self.client_id}: ledger state uses accountant "
                                      f"{state['accountant']!r}/{state.get('neighboring')!r}, this ledger "
                                      f"{self.accountant!r}/{self.neighboring!r}.")
            budget = Budget(**state["budget"])
            history = [(event_from_dict(e["event"]), _check_count(e["count"])) for e in state["events"]]
            acc = make_accountant(self.accountant, self.neighboring)
            for ev, n in history:
                acc.compose(ev, n)
        except (KeyError, TypeError, ValueError, dpa_accountant.UnsupportedEventError) as exc:
            if isinstance(exc, CheckpointError):
                raise
            raise CheckpointError(f"client {self.client_id}: corrupt ledger state ({exc}).") from exc
        self.budget, self._acc, self._history, self._epsilon = budget, acc, history, None

    def __repr__(self) -> str:
        return (f"PrivacyLedger(client_id={self.client_id}, budget={self.budget}, accountant={self.accountant!r}, "
                f"events={len(self._history)})")


class LedgerBook:
    """One :class:`PrivacyLedger` per client.

    Args:
      budgets: client id (an integer) → budget.
      accountant: accountant of every ledger (``"rdp"`` or ``"pld"``).
      neighboring: neighbouring relation of every ledger.

    Raises:
      PrivacyError: ``budgets`` not a mapping, a key not an integer, a value not a Budget, or an unknown
        ``accountant`` / ``neighboring``.
    """

    def __init__(self, budgets: Mapping[int, Budget], accountant: str = "rdp",
                 neighboring: str = "add_remove") -> None:
        if not isinstance(budgets, Mapping):
            raise PrivacyError(f"`budgets` must be a mapping of client id to Budget, found {type(budgets).__name__}.")
        _check_accounting(accountant, neighboring)
        self.accountant = accountant
        self.neighboring = neighboring
        self._ledgers: dict[int, PrivacyLedger] = {}
        for cid, budget in budgets.items():
            self.add_client(cid, budget)

    def add_client(self, client_id: int, budget: Budget) -> PrivacyLedger:
        """Open a ledger for a new client (PrivacyError: ``client_id`` not an integer, or already present)."""
        client_id = _check_client_id(client_id)
        if client_id in self._ledgers:
            raise PrivacyError(f"client {client_id} already has a ledger.")
        ledger = PrivacyLedger(client_id, budget, self.accountant, self.neighboring)
        self._ledgers[client_id] = ledger
        return ledger

    def __getitem__(self, client_id: int) -> PrivacyLedger:
        try:
            return self._ledgers[int(client_id)]
        except (KeyError, TypeError, ValueError):
            raise PrivacyError(f"client {client_id!r} has no ledger; known clients: "
                               f"{sorted(self._ledgers)}.") from None

    def __contains__(self, client_id: object) -> bool:
        try:
            return client_id in self._ledgers
        except TypeError:  # unhashable
            return False

    def __len__(self) -> int:
        return len(self._ledgers)

    @property
    def client_ids(self) -> list[int]:
        return sorted(self._ledgers)

    def charge(self, events: Iterable[tuple[int, DpEvent]]) -> None:
        """Compose each (client id, event) pair, all or nothing.

        Every event is first checked (known client, supported, within budget, several events of one client
        composed together); only if all pass are the ledgers updated.

        Raises:
          PrivacyError: unknown client. UnsupportedEventError / BudgetExceededError: as
          :meth:`PrivacyLedger.compose`. No ledger changes in any of these cases.
        """
        per_client: dict[int, list[DpEvent]] = {}
        for cid, event in events:
            ledger = self[cid]
            ledger._require_supported(event)
            per_client.setdefault(ledger.client_id, []).append(event)
        staged = []
        for cid, evs in per_client.items():
            ledger = self._ledgers[cid]
            trial = copy.deepcopy(ledger._acc)
            for ev in evs:
                trial.compose(ev)
            eps = None if ledger.budget.unlimited else float(trial.get_epsilon(ledger.budget.delta))
            if eps is not None and not ledger.budget.allows(eps):
                raise BudgetExceededError(
                    f"client {cid}: this charge ({len(evs)} event(s)) would spend ε = {_fmt_eps(eps)} at "
                    f"δ = {ledger.budget.delta:g}, over its budget ε = {ledger.budget.epsilon!r}; no ledger was "
                    f"changed.")
            staged.append((ledger, trial, eps, [(ev, 1) for ev in evs]))
        for ledger, trial, eps, entries in staged:
            ledger._commit(trial, eps, entries)

    def epsilons(self) -> dict[int, float]:
        """ε spent by every client, at its own δ."""
        return {cid: self._ledgers[cid].epsilon_spent() for cid in sorted(self._ledgers)}

    def summary(self) -> dict[str, float]:
        """``{"min": ..., "median": ..., "max": ..., "clients": n}`` of the ε spent."""
        values = list(self.epsilons().values())
        if not values:
            return {"min": 0.0, "median": 0.0, "max": 0.0, "clients": 0}
        return {"min": min(values), "median": float(statistics.median(values)), "max": max(values),
                "clients": len(values)}

    def state_dict(self) -> dict[str, Any]:
        return {"accountant": self.accountant, "neighboring": self.neighboring,
                "ledgers": [self._ledgers[cid].state_dict() for cid in sorted(self._ledgers)]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore every ledger (clients in the state but not in the book are added); all or nothing."""
        if state.get("accountant") != self.accountant or state.get("neighboring") != self.neighboring:
            raise CheckpointError(f"Ledger book state uses {state.get('accountant')!r}/{state.get('neighboring')!r}, "
                                  f"this book {self.accountant!r}/{self.neighboring!r}.")
        restored: dict[int, PrivacyLedger] = {}
        for ledger_state in state.get("ledgers", []):
            try:
                ledger = PrivacyLedger(int(ledger_state["client_id"]), Budget(**ledger_state["budget"]),
                                       self.accountant, self.neighboring)
            except (KeyError, TypeError, PrivacyError) as exc:
                raise CheckpointError(f"Corrupt ledger book state ({exc}).") from exc
            ledger.load_state_dict(ledger_state)
            restored[ledger.client_id] = ledger
        self._ledgers.update(restored)


def check_schedule(client_id: int, budget: Budget, event: DpEvent, steps: int, accountant: str = "rdp",
                   neighboring: str = "add_remove") -> float:
    """ε that ``steps`` repetitions of ``event`` would spend at ``budget.delta``, checked before training.

    Raises:
      BudgetExceededError: e.g. "client 3: the schedule would spend ε = 4.12 at δ = 1e-05, over its budget
        ε = 3.0".
      UnsupportedEventError: the accountant cannot compose ``event``.
    """
    ledger = PrivacyLedger(client_id, Budget(math.inf, budget.delta), accountant, neighboring)
    ledger.compose(event, _check_count(steps))
    eps = ledger.epsilon_spent()
    if not budget.allows(eps):
        raise BudgetExceededError(f"client {client_id}: the schedule would spend ε = {_fmt_eps(eps)} at "
                                  f"δ = {budget.delta:g}, over its budget ε = {budget.epsilon!r}")
    return eps
