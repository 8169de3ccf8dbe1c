"""The telecom user's side: their phone's state and their surroundings (tau2's user database).

Field names, order and defaults are tau2's (they decide the user database hash); the models a
user tool's schema shows (``APNSettings``, ``APNNames``, ``NetworkModePreference``) carry the
original's descriptions too. Values are not re-validated on assignment, as in tau2.
"""

from __future__ import annotations

from enum import Enum
from typing import Self

from pydantic import Field

from builtin_envs.tau2.db import Tau2DB, deep_copy
from builtin_envs.tau2.domains.telecom.models import Record

__all__ = [
    "APNNames",
    "APNSettings",
    "AppPermissions",
    "AppStatus",
    "MockPhoneAttributes",
    "NetworkModePreference",
    "NetworkStatus",
    "NetworkTechnology",
    "PaymentRequest",
    "PerformanceLevel",
    "SignalStrength",
    "SimStatus",
    "TelecomUserDB",
    "UserSurroundings",
    "VpnDetails",
]


class SimStatus(str, Enum):  # noqa: UP042 - tau2's str mixin (its repr and str() differ)
    ACTIVE = "active"
    MISSING = "missing"
    LOCKED_PIN = "locked_pin"
    LOCKED_PUK = "locked_puk"


class NetworkTechnology(str, Enum):  # noqa: UP042
    NONE = "none"
    TWO_G = "2G"
    THREE_G = "3G"
    FOUR_G = "4G"
    FIVE_G = "5G"


class NetworkModePreference(str, Enum):  # noqa: UP042
    FOUR_G_5G_PREFERRED = "4g_5g_preferred"
    FOUR_G_ONLY = "4g_only"
    THREE_G_ONLY = "3g_only"
    TWO_G_ONLY = "2g_only"


class SignalStrength(str, Enum):  # noqa: UP042
    NONE = "none"
    POOR = "poor"
    FAIR = "fair"
    GOOD = "good"
    EXCELLENT = "excellent"


class PerformanceLevel(str, Enum):  # noqa: UP042
    UNKNOWN = "unknown"
    POOR = "poor"
    FAIR = "fair"
    GOOD = "good"
    EXCELLENT = "excellent"


class NetworkStatus(str, Enum):  # noqa: UP042
    CONNECTED = "connected"
    SEARCHING = "searching"
    NO_SERVICE = "no_service"
    EMERGENCY_ONLY = "emergency_only"


class APNNames(str, Enum):  # noqa: UP042
    INTERNET = "internet"
    BROKEN = "broken"


class APNSettings(Record):
    """Represents the configuration for a single Access Point Name (APN)."""

    apn_name: APNNames = Field(
        default=APNNames.INTERNET, description="The name identifier for the APN connection."
    )
    reset_at_reboot: bool = Field(
        default=False, description="Whether the APN settings will be reset at the next reboot."
    )
    mms_apn: str | None = Field(
        default="mms",
        description="Specific APN name used for MMS traffic, if different from general data.",
    )
    mmsc_url: str | None = Field(
        default="http://mms.carrier.com/mms/wapenc",
        description="The URL of the Multimedia Messaging Service Center (MMSC). Crucial for MMS.",
    )
    mms_proxy: str | None = Field(
        default=None,
        description="The proxy server address required for MMS traffic on some networks.",
    )
    mms_port: int | None = Field(
        default=None, description="The proxy server port required for MMS traffic on some networks."
    )


class VpnDetails(Record):
    server_address: str | None = None
    protocol: str | None = None
    server_performance: PerformanceLevel = Field(
        default=PerformanceLevel.UNKNOWN, validate_default=True
    )


class AppPermissions(Record):
    sms: bool = False
    storage: bool = False
    phone: bool = False
    network: bool = False


class AppStatus(Record):
    app_name: str
    permissions: AppPermissions = Field(default_factory=AppPermissions)


def _default_apps() -> dict[str, AppStatus]:
    return {
        "messaging": AppStatus(
            app_name="messaging", permissions=AppPermissions(sms=True, storage=True, phone=True)
        ),
        "browser": AppStatus(
            app_name="browser", permissions=AppPermissions(network=True, storage=True)
        ),
    }


class MockPhoneAttributes(Record):
    """The phone: SIM, radios, data, APN, Wi-Fi, calling, VPN and app settings."""

    sim_card_status: SimStatus = Field(default=SimStatus.ACTIVE, validate_default=True)
    sim_card_missing: bool = False
    airplane_mode: bool = False
    network_signal_strength: SignalStrength = Field(
        default=SignalStrength.GOOD, validate_default=True
    )
    network_technology_connected: NetworkTechnology = Field(
        default=NetworkTechnology.FIVE_G, validate_default=True
    )
    network_connection_status: NetworkStatus = Field(
        default=NetworkStatus.CONNECTED, validate_default=True
    )
    battery_level: int = 80
    data_enabled: bool = True
    roaming_enabled: bool = False
    network_mode_preference: NetworkModePreference = Field(
        default=NetworkModePreference.FOUR_G_5G_PREFERRED, validate_default=True
    )
    active_apn_settings: APNSettings = Field(default_factory=APNSettings)
    wifi_enabled: bool = False
    wifi_connected: bool = False
    wifi_ssid: str | None = None
    wifi_signal_strength: SignalStrength = Field(default=SignalStrength.NONE, validate_default=True)
    wifi_calling_enabled: bool = False
    wifi_calling_mms_over_wifi: bool = False
    data_saver_mode: bool = False
    vpn_enabled_setting: bool = False
    vpn_connected: bool = False
    vpn_details: VpnDetails | None = None
    app_statuses: dict[str, AppStatus] = Field(default_factory=_default_apps)


class PaymentRequest(Record):
    bill_id: str
    amount_due: float
    paid: bool = False


def _default_signal() -> dict[NetworkTechnology, SignalStrength]:
    return {
        NetworkTechnology.TWO_G: SignalStrength.POOR,
        NetworkTechnology.THREE_G: SignalStrength.FAIR,
        NetworkTechnology.FOUR_G: SignalStrength.GOOD,
        NetworkTechnology.FIVE_G: SignalStrength.EXCELLENT,
    }


class UserSurroundings(Record):
    """Where the user is: who they are, abroad or not, signal, what the carrier allows."""

    name: str | None = None
    phone_number: str | None = None
    is_abroad: bool = False
    roaming_allowed: bool = False
    signal_strength: dict[NetworkTechnology, SignalStrength] = Field(
        default_factory=_default_signal
    )
    mobile_data_usage_exceeded: bool = False
    line_active: bool = True
    payment_request: PaymentRequest | None = None


class TelecomUserDB(Tau2DB):
    """The user's database: their phone and their surroundings (small: forked by copying)."""

    device: MockPhoneAttributes = Field(default_factory=MockPhoneAttributes)
    surroundings: UserSurroundings = Field(default_factory=UserSurroundings)

    def fork(self) -> Self:
        """An independent copy (:func:`~builtin_envs.tau2.db.deep_copy`)."""
        copied: Self = deep_copy(self)
        return copied
