"""The airline domain's tool vocabulary: names only (pure, no τ² import), shared by the environment
(`longhaul.envs.airline.tools`, `.tasks`) and the PRM-Lite rules (`longhaul.rewards.prm_lite`), so a tool's class
is written down once."""

from __future__ import annotations

#: The agent tools, in the order the package's server lists them.
TOOL_NAMES: tuple[str, ...] = (
    "book_reservation",
    "calculate",
    "cancel_reservation",
    "get_reservation_details",
    "get_user_details",
    "list_all_airports",
    "search_direct_flight",
    "search_onestop_flight",
    "send_certificate",
    "transfer_to_human_agents",
    "update_reservation_baggages",
    "update_reservation_flights",
    "update_reservation_passengers",
    "get_flight_status",
)
#: The tools that change the database (τ²'s write tools): task analysis (`AirlineTask`) and PRM-Lite's write rules
#: (`longhaul.rewards.prm_lite`) both read this set.
WRITE_TOOLS = frozenset(
    {
        "book_reservation",
        "cancel_reservation",
        "send_certificate",
        "update_reservation_baggages",
        "update_reservation_flights",
        "update_reservation_passengers",
    }
)
