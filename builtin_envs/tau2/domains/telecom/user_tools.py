"""The telecom user's tools (tau2's ``TelecomUserTools``): what the user does on their phone.

The phone is simulated as in tau2: toggles change settings, then a network search decides the
connection from the SIM, the preferred mode, airplane mode, the APN and whether the line is
active (the line's state comes from the agent's side, see ``TelecomEnvironment.sync_tools``).
Output strings are the original's, status bar icons included. Methods that are not tools
(``set_user_info``, ``turn_*``, ``break_*``, ``assert_*``, ...) are what tasks name in their
initialization actions and assertions.

One deliberate difference: tau2 connects a VPN by assigning a class-wide default
``VpnDetails`` object, which ``break_vpn`` then mutates, so in tau2 a ``break_vpn`` leaks a poor
VPN into every later episode of the same process. Here each toolkit (episode) has its own
default: every episode behaves as the first one of a fresh tau2 process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Self

from builtin_envs.tau2.db import deep_copy, frozen_copier
from builtin_envs.tau2.domains.telecom.user_models import (
    APNNames,
    APNSettings,
    AppPermissions,
    AppStatus,
    MockPhoneAttributes,
    NetworkModePreference,
    NetworkStatus,
    NetworkTechnology,
    PaymentRequest,
    PerformanceLevel,
    SignalStrength,
    SimStatus,
    TelecomUserDB,
    UserSurroundings,
    VpnDetails,
)
from builtin_envs.tau2.toolkit import ToolKind, Toolkit, tool

__all__ = ["TelecomUserTools"]

_SIGNAL_ICONS = {
    SignalStrength.NONE: "📵 No Signal",
    SignalStrength.POOR: "📶¹ Poor",
    SignalStrength.FAIR: "📶² Fair",
    SignalStrength.GOOD: "📶³ Good",
    SignalStrength.EXCELLENT: "📶⁴ Excellent",
}
# Mbps range by technology; share of it by signal strength
_SPEED_RANGE = {
    NetworkTechnology.TWO_G: (0.1, 0.4),
    NetworkTechnology.THREE_G: (1.0, 5.0),
    NetworkTechnology.FOUR_G: (10.0, 100.0),
    NetworkTechnology.FIVE_G: (50.0, 500.0),
    NetworkTechnology.NONE: (0.0, 0.0),
}
_SIGNAL_FACTOR = {
    SignalStrength.POOR: 0.2,
    SignalStrength.FAIR: 0.5,
    SignalStrength.GOOD: 0.8,
    SignalStrength.EXCELLENT: 1.0,
    SignalStrength.NONE: 0.0,
}
_SPEED_ADVICE = {
    "Very Poor": "Connection is very slow. Basic web browsing might be difficult.",
    "Poor": "Connection is slow. Web browsing may be sluggish, streaming difficult.",
    "Fair": "Connection is okay for web browsing and some standard definition streaming.",
    "Good": "Connection is good for most activities, including HD streaming.",
    "Excellent": "Connection is very fast.",
}
_SIM_TEXT = {
    SimStatus.ACTIVE: "Your SIM card is active and working.",
    SimStatus.MISSING: "No SIM card detected in the phone.",
    SimStatus.LOCKED_PIN: "The SIM card is locked with a PIN code.",
    SimStatus.LOCKED_PUK: "The SIM card is locked with a PUK code.",
}


def _on(flag: Any) -> str:
    return "ON" if flag else "OFF"


def _yes(flag: Any) -> str:
    return "Yes" if flag else "No"


def _granted(permissions: AppPermissions) -> list[str]:
    return [
        name.replace("_", " ").lower()
        for name, allowed in permissions.model_dump().items()
        if allowed
    ]


class TelecomUserTools(Toolkit):
    """
    Provides methods to simulate user actions and agent instructions
    on a MockPhoneAttributes instance.
    """

    db: TelecomUserDB

    def __init__(self, db: TelecomUserDB, default_vpn_details: VpnDetails | None = None) -> None:
        super().__init__(db)
        # see the module docstring: one default per episode, not per process
        if default_vpn_details is None:
            default_vpn_details = VpnDetails(
                server_address="192.168.1.1",
                protocol="OpenVPN",
                server_performance=PerformanceLevel.EXCELLENT,
            )
        self.default_vpn_details = default_vpn_details

    _frozen = False
    _copy_db: Callable[[], TelecomUserDB] | None = None  # frozen: copies the phone

    def freeze(self) -> None:
        """This phone no longer changes: forks copy it by a plan made once, on the first fork
        (:func:`~builtin_envs.tau2.db.frozen_copier`)."""
        super().freeze()
        self._frozen = True

    def fork(self) -> Self:
        """This phone copied, with the episode's VPN default (one copy where they are one
        object: after ``break_vpn`` the phone's VPN is the default)."""
        vpn = self.default_vpn_details
        if self._frozen:
            if self._copy_db is None:
                self._copy_db = frozen_copier(self.db)
            db = self._copy_db()
            shared = self.db.device.vpn_details is vpn
            return type(self)(db, db.device.vpn_details if shared else deep_copy(vpn))
        memo: dict[int, Any] = {}
        db = deep_copy(self.db, memo)
        return type(self)(db, deep_copy(vpn, memo))

    @property
    def device(self) -> MockPhoneAttributes:
        """The phone's state."""
        return self.db.device

    @property
    def surroundings(self) -> UserSurroundings:
        """The user's surroundings."""
        return self.db.surroundings

    def _with_bar(self, text: str) -> str:
        return f"{text}\nStatus Bar: {self._check_status_bar()}"

    # -- who and where (tasks' initialization) ----------------------------------------------------

    def set_user_info(self, name: str, phone_number: str) -> None:
        """Set the user's name and phone number."""
        self.db.surroundings.name = name
        self.db.surroundings.phone_number = phone_number

    def set_user_location(self, abroad: bool) -> None:
        """Put the user abroad or at home."""
        self.db.surroundings.is_abroad = abroad

    # -- status bar -------------------------------------------------------------------------------

    @tool(ToolKind.READ)
    def check_status_bar(self) -> str:
        """Shows what icons are currently visible in your phone's status bar (the area at the top of the screen). Displays network signal strength, mobile data status (enabled, disabled, data saver), Wi-Fi status, and battery level."""  # noqa: E501
        return f"Status Bar: {self._check_status_bar()}"

    def _check_status_bar(self) -> str:
        device = self.device
        parts = []
        if device.airplane_mode:
            parts.append("✈️ Airplane Mode")
        else:
            parts.append(_SIGNAL_ICONS.get(device.network_signal_strength, "📵 No Signal"))
            tech = device.network_technology_connected
            if tech != NetworkTechnology.NONE:
                parts.append(tech.value)
            if device.data_enabled and tech != NetworkTechnology.NONE:
                parts.append("📱 Data Enabled")
                if device.data_saver_mode:
                    parts.append("🔽 Data Saver")
            else:
                parts.append("📵 Data Disabled")
        if device.wifi_enabled and device.wifi_connected:
            parts.append(
                f"📡 Connected to {device.wifi_ssid}" if device.wifi_ssid else "📡 Enabled"
            )
        if device.vpn_connected:
            parts.append("🔒 VPN Connected")
        parts.append(f"🔋 {device.battery_level}%")
        return " | ".join(parts)

    # -- network ----------------------------------------------------------------------------------

    @tool(ToolKind.READ)
    def check_network_status(self) -> str:
        """Checks your phone's connection status to cellular networks and Wi-Fi. Shows airplane mode status, signal strength, network type, whether mobile data is enabled, and whether data roaming is enabled."""  # noqa: E501
        device = self.device
        lines = [
            f"Airplane Mode: {_on(device.airplane_mode)}",
            f"SIM Card Status: {self._check_sim_status().value}",
            f"Cellular Connection: {device.network_connection_status.value}",
            f"Cellular Signal: {device.network_signal_strength.value}",
            f"Cellular Network Type: {device.network_technology_connected.value}",
            f"Mobile Data Enabled: {_yes(device.data_enabled)}",
            f"Data Roaming Enabled: {_yes(device.roaming_enabled)}",
            f"Wi-Fi Radio: {_on(device.wifi_enabled)}",
            f"Wi-Fi Connected: {_yes(device.wifi_connected)}",
        ]
        if device.wifi_connected:
            lines.append(f"Connected Wi-Fi Network: {device.wifi_ssid}")
        return "\n".join(lines)

    @tool(ToolKind.READ)
    def check_network_mode_preference(self) -> str:
        """Shows the current network mode preference."""
        return f"Network Mode Preference: {self.device.network_mode_preference.value}"

    @tool(ToolKind.WRITE)
    def set_network_mode_preference(self, mode: NetworkModePreference | str) -> str:
        """Changes the type of cellular network your phone prefers to connect to (e.g., 5G, LTE/4G, 3G). Higher-speed networks (LTE/5G) provide faster data but may use more battery."""  # noqa: E501
        chosen: Any = mode
        try:
            if isinstance(chosen, str):
                chosen = NetworkModePreference(chosen)
            # stored as given when it is not a string, as tau2 stores it
            self.device.network_mode_preference = chosen
            self.simulate_network_search()
        except ValueError:
            chosen = None
        if chosen is None:
            options = ", ".join(m.value for m in NetworkModePreference)
            return self._with_bar(
                f"Failed to set network mode: '{mode}' is not a valid option. "
                f"Please use one of: {options}"
            )
        return self._with_bar(f"Preferred Network Mode set to: {chosen.value}")

    def _get_mobile_data_working(self) -> bool:
        device, where = self.device, self.surroundings
        if device.airplane_mode or device.network_signal_strength == SignalStrength.NONE:
            return False
        if device.network_connection_status == NetworkStatus.NO_SERVICE:
            return False
        if where.is_abroad and (not device.roaming_enabled or not where.roaming_allowed):
            return False
        if not device.data_enabled:
            return False
        return not where.mobile_data_usage_exceeded

    @tool(ToolKind.READ)
    def run_speed_test(self) -> str:
        """Measures your current internet connection speed (download speed). Provides information about connection quality and what activities it can support."""  # noqa: E501
        speed, description = self._run_speed_test()
        if speed is None:
            return f"Speed test failed: {description or 'Could not determine speed'}."
        advice = _SPEED_ADVICE.get(description or "", "")
        return f"Speed Test Result: {speed:.2f} Mbps ({description}). {advice}"

    def _run_speed_test(self) -> tuple[float | None, str | None]:
        if not self._get_mobile_data_working():
            return None, "No Connection"
        device = self.device
        factor = 1.0
        if (
            device.vpn_connected
            and device.vpn_details
            and device.vpn_details.server_performance == PerformanceLevel.POOR
        ):
            factor = 0.1
        if device.data_saver_mode:
            factor *= 0.2
        low, high = _SPEED_RANGE.get(device.network_technology_connected, (0.0, 0.0))
        signal = _SIGNAL_FACTOR.get(device.network_signal_strength, 0.0)
        speed = round((low + high) / 2.0 * signal * factor, 2)
        if speed < 1:
            return speed, "Very Poor"
        if speed < 5:
            return speed, "Poor"
        if speed < 25:
            return speed, "Fair"
        if speed < 100:
            return speed, "Good"
        return speed, "Excellent"

    # -- airplane mode ----------------------------------------------------------------------------

    @tool(ToolKind.WRITE)
    def toggle_airplane_mode(self) -> str:
        """Toggles Airplane Mode ON or OFF. When ON, it disconnects all wireless communications including cellular, Wi-Fi, and Bluetooth.
        Returns the new state of airplane_mode.
        """  # noqa: E501
        return self._with_bar(f"Airplane Mode is now {_on(self._toggle_airplane_mode())}.")

    def _toggle_airplane_mode(self) -> bool:
        device = self.device
        was_on = device.airplane_mode
        device.airplane_mode = not was_on
        if was_on:
            device.network_connection_status = NetworkStatus.SEARCHING
            if device.wifi_enabled:
                self._drop_wifi()
        else:
            self._drop_wifi()
            if device.vpn_connected:
                self._disconnect_vpn()
        self.simulate_network_search()
        return device.airplane_mode

    def _drop_wifi(self) -> None:
        self.device.wifi_connected = False
        self.device.wifi_ssid = None
        self.device.wifi_signal_strength = SignalStrength.NONE

    def turn_airplane_mode_on(self) -> str:
        """Turn Airplane Mode ON."""
        if not self._toggle_airplane_mode():
            self._toggle_airplane_mode()
        return "Airplane Mode is now ON."

    def turn_airplane_mode_off(self) -> str:
        """Turn Airplane Mode OFF."""
        if self._toggle_airplane_mode():
            self._toggle_airplane_mode()
        return "Airplane Mode is now OFF."

    # -- SIM card ---------------------------------------------------------------------------------

    @tool(ToolKind.READ)
    def check_sim_status(self) -> str:
        """Checks if your SIM card is working correctly and displays its current status. Shows if the SIM is active, missing, or locked with a PIN or PUK code."""  # noqa: E501
        status = self._check_sim_status()
        return _SIM_TEXT.get(status, f"Unknown SIM status: {status.value}")

    def _check_sim_status(self) -> SimStatus:
        if self.device.sim_card_missing:
            return SimStatus.MISSING
        return self.device.sim_card_status

    @tool(ToolKind.WRITE)
    def reseat_sim_card(self) -> str:
        """Simulates removing and reinserting your SIM card. This can help resolve recognition issues."""  # noqa: E501
        self.device.sim_card_missing = False
        self.simulate_network_search()
        return self._with_bar("SIM card re-seated successfully.")

    def unseat_sim_card(self) -> str:
        """Take the SIM card out (``reseat_sim_card`` fixes it)."""
        self.device.sim_card_missing = True
        self.simulate_network_search()
        return "SIM card un-seated successfully."

    def lock_sim_card(self, mode: Literal["pin", "puk"]) -> str:
        """Lock the SIM card with a PIN or a PUK (no tool fixes it)."""
        if mode == "pin":
            self.device.sim_card_status = SimStatus.LOCKED_PIN
        elif mode == "puk":
            self.device.sim_card_status = SimStatus.LOCKED_PUK
        self.simulate_network_search()
        return f"SIM card locked successfully in {mode} mode."

    # -- mobile data and roaming ------------------------------------------------------------------

    @tool(ToolKind.WRITE)
    def toggle_data(self) -> str:
        """Toggles your phone's mobile data connection ON or OFF. Controls whether your phone can use cellular data for internet access when Wi-Fi is unavailable.
        Returns the new data connection status.
        """  # noqa: E501
        return self._with_bar(f"Mobile Data is now {_on(self._toggle_data())}.")

    def _toggle_data(self) -> bool:
        self.device.data_enabled = not self.device.data_enabled
        self.simulate_network_search()
        return self.device.data_enabled

    def turn_data_on(self) -> str:
        """Turn mobile data ON."""
        self.device.data_enabled = True
        return "Data connection restored."

    def turn_data_off(self) -> str:
        """Turn mobile data OFF."""
        if self._toggle_data():
            self._toggle_data()
        return "Data connection broken."

    @tool(ToolKind.WRITE)
    def toggle_roaming(self) -> str:
        """Toggles Data Roaming ON or OFF. When ON, your phone can use data networks in areas outside your carrier's coverage.
        Returns the new data roaming status.
        """  # noqa: E501
        return self._with_bar(f"Data Roaming is now {_on(self._toggle_roaming())}.")

    def _toggle_roaming(self) -> bool:
        self.device.roaming_enabled = not self.device.roaming_enabled
        self.simulate_network_search()
        return self.device.roaming_enabled

    def turn_roaming_on(self) -> str:
        """Turn data roaming ON."""
        if not self._toggle_roaming():
            self._toggle_roaming()
        return "Data Roaming is now ON."

    def turn_roaming_off(self) -> str:
        """Turn data roaming OFF."""
        if self._toggle_roaming():
            self._toggle_roaming()
        return "Data Roaming is now OFF."

    @tool(ToolKind.READ)
    def check_data_restriction_status(self) -> str:
        """Checks if your phone has any data-limiting features active. Shows if Data Saver mode is on."""  # noqa: E501
        if self.device.data_saver_mode:
            return "Data Saver mode is ON (limits data usage)."
        return "Data Saver mode is OFF."

    @tool(ToolKind.WRITE)
    def toggle_data_saver_mode(self) -> str:
        """Toggles Data Saver mode ON or OFF. When ON, it reduces data usage, which may affect data speed.
        Returns the new data saver mode status.
        """  # noqa: E501
        return self._with_bar(f"Data Saver Mode is now {_on(self._toggle_data_saver_mode())}.")

    def _toggle_data_saver_mode(self) -> bool:
        self.device.data_saver_mode = not self.device.data_saver_mode
        return self.device.data_saver_mode

    def turn_data_saver_mode_on(self) -> str:
        """Turn Data Saver ON."""
        if not self._toggle_data_saver_mode():
            self._toggle_data_saver_mode()
        return "Data Saver Mode is now ON."

    def turn_data_saver_mode_off(self) -> str:
        """Turn Data Saver OFF."""
        if self._toggle_data_saver_mode():
            self._toggle_data_saver_mode()
        return "Data Saver Mode is now OFF."

    # -- APN --------------------------------------------------------------------------------------

    @tool(ToolKind.READ)
    def check_apn_settings(self) -> str:
        """Checks the technical APN settings your phone uses to connect to your carrier's mobile data network. Shows current APN name and MMSC URL for picture messaging."""  # noqa: E501
        settings = self.device.active_apn_settings.model_copy(deep=True)
        name = settings.apn_name.value or "Not Set"
        url = settings.mmsc_url or "Not Set"
        return (
            f"Current APN Name: {name}\nMMSC URL (for picture messages): {url}\n"
            "(These are technical settings, usually best left unchanged.)"
        )

    @tool(ToolKind.WRITE)
    def set_apn_settings(self, apn_settings: APNSettings | dict) -> str:  # type: ignore[type-arg]
        """Sets the APN settings for the phone."""
        if isinstance(apn_settings, dict):
            apn_settings = APNSettings(**apn_settings)
        # stored as given when it is neither, as tau2 stores it (the next line then fails)
        self.device.active_apn_settings = apn_settings
        update = f"APN settings set to: {apn_settings.apn_name.value}"
        self.simulate_network_search()
        return self._with_bar(update)

    @tool(ToolKind.WRITE)
    def reset_apn_settings(self) -> str:
        """Resets your APN settings to the default settings."""
        self.device.active_apn_settings.reset_at_reboot = True
        self.simulate_network_search()
        return self._with_bar("APN settings will reset at reboot.")

    def break_apn_settings(self) -> str:
        """Break the APN (``reset_apn_settings`` and a reboot fix it)."""
        self.device.active_apn_settings.apn_name = APNNames.BROKEN
        self.simulate_network_search()
        return "APN settings broken. Please call reset_apn_settings() to fix."

    def break_apn_mms_setting(self) -> str:
        """Remove the MMSC URL (``reset_apn_settings`` and a reboot fix it)."""
        self.device.active_apn_settings.mmsc_url = None
        return "APN MMS setting broken. Please call reset_apn_settings() to fix."

    # -- Wi-Fi ------------------------------------------------------------------------------------

    @tool(ToolKind.READ)
    def check_wifi_status(self) -> str:
        """Checks your Wi-Fi connection status. Shows if Wi-Fi is turned on, which network you're connected to (if any), and the signal strength."""  # noqa: E501
        device = self.device
        if not device.wifi_enabled:
            return "Wi-Fi is turned OFF."
        if device.wifi_connected:
            return (
                f"Wi-Fi is ON and connected to '{device.wifi_ssid}'. "
                f"Signal strength: {device.wifi_signal_strength.value}."
            )
        return "Wi-Fi is ON but not connected to any network."

    @tool(ToolKind.WRITE)
    def toggle_wifi(self) -> str:
        """Toggles your phone's Wi-Fi radio ON or OFF. Controls whether your phone can discover and connect to wireless networks for internet access.
        Returns the new Wi-Fi status.
        """  # noqa: E501
        if self.device.airplane_mode:
            return self._with_bar("Cannot change Wi-Fi settings while Airplane Mode is ON.")
        self.device.wifi_enabled = not self.device.wifi_enabled
        if not self.device.wifi_enabled:
            self._drop_wifi()
        return self._with_bar(f"Wi-Fi is now {_on(self.device.wifi_enabled)}.")

    @tool(ToolKind.READ)
    def check_wifi_calling_status(self) -> str:
        """Checks if Wi-Fi Calling is enabled on your device. This feature allows you to make and receive calls over a Wi-Fi network instead of using the cellular network."""  # noqa: E501
        return f"Wi-Fi Calling is currently turned {_on(self.device.wifi_calling_enabled)}."

    @tool(ToolKind.WRITE)
    def toggle_wifi_calling(self) -> str:
        """Toggles Wi-Fi Calling ON or OFF. This feature allows you to make and receive calls over Wi-Fi instead of the cellular network, which can help in areas with weak cellular signal.
        Returns the new Wi-Fi Calling status.
        """  # noqa: E501
        self.device.wifi_calling_enabled = not self.device.wifi_calling_enabled
        return self._with_bar(f"Wi-Fi Calling is now {_on(self.device.wifi_calling_enabled)}.")

    def set_wifi_calling(self, enabled: bool, mms_over_wifi: bool | None = None) -> str:
        """Set Wi-Fi Calling (and MMS over Wi-Fi, when given)."""
        if self.device.wifi_calling_enabled != enabled:
            self.device.wifi_calling_enabled = not self.device.wifi_calling_enabled
        message = f"Wi-Fi Calling is now {_on(enabled)}."
        if mms_over_wifi is not None:
            self.device.wifi_calling_mms_over_wifi = mms_over_wifi
            message += f"\nMMS over Wi-Fi is now {_on(mms_over_wifi)}."
        return message

    # -- VPN --------------------------------------------------------------------------------------

    @tool(ToolKind.READ)
    def check_vpn_status(self) -> str:
        """Checks if you're using a VPN (Virtual Private Network) connection. Shows if a VPN is active, connected, and displays any available connection details."""  # noqa: E501
        device = self.device
        if device.vpn_connected:
            if device.vpn_details:
                # a dict's str(), enum reprs included, as tau2 shows it
                return f"VPN is ON and connected. Details: {device.vpn_details.model_dump()}"
            return "VPN is ON and connected (no specific details available)."
        if device.vpn_enabled_setting:
            return "VPN is turned ON in settings, but currently not connected."
        return "VPN is turned OFF."

    @tool(ToolKind.WRITE)
    def connect_vpn(self) -> str:
        """Connects to your VPN (Virtual Private Network)."""
        if self.device.vpn_connected:
            return "VPN already connected."
        self.device.vpn_connected = True
        self.device.vpn_details = self.default_vpn_details  # shared on purpose: see break_vpn
        return self._with_bar("VPN connected successfully.")

    @tool(ToolKind.WRITE)
    def disconnect_vpn(self) -> str:
        """Disconnects any active VPN (Virtual Private Network) connection. Stops routing your internet traffic through a VPN server, which might affect connection speed or access to content."""  # noqa: E501
        done = self._disconnect_vpn()
        return self._with_bar(
            "VPN disconnected successfully." if done else "No active VPN connection to disconnect."
        )

    def _disconnect_vpn(self) -> bool:
        if not self.device.vpn_connected:
            return False
        self.device.vpn_connected = False
        self.device.vpn_details = None
        return True

    def break_vpn(self) -> str:
        """Connect a VPN with poor performance (slow mobile data)."""
        self.connect_vpn()
        self.device.vpn_details.server_performance = PerformanceLevel.POOR  # type: ignore[union-attr]
        return "VPN connection broken."

    # -- apps -------------------------------------------------------------------------------------

    @tool(ToolKind.READ)
    def check_installed_apps(self) -> str:
        """Returns the name of all installed apps on the phone."""
        names = ", ".join(self.device.app_statuses.keys())
        return f"The following apps are installed on the phone: {names}"

    @tool(ToolKind.READ)
    def check_app_status(self, app_name: str) -> str:
        """Checks detailed information about a specific app. Shows its permissions and background data usage settings."""  # noqa: E501
        app = self.device.app_statuses.get(app_name)
        if not app:
            return f"App '{app_name}' not found on this phone."
        lines = [f"Status for App: {app_name}"]
        granted = _granted(app.permissions)
        if not granted:
            lines.append(" - Permissions: None granted.")
        else:
            lines.append(" - Permissions Granted:")
            lines.extend(f"   - {perm}" for perm in granted)
        return "\n".join(lines)

    @tool(ToolKind.READ)
    def check_app_permissions(self, app_name: str) -> str:
        """Checks what permissions a specific app currently has. Shows if the app has access to features like storage, camera, location, etc."""  # noqa: E501
        app = self.device.app_statuses.get(app_name)
        if not app:
            return f"App '{app_name}' not found on this phone."
        granted = _granted(app.permissions)
        if not granted:
            return f"App '{app_name}' currently has no permissions granted."
        return f"App '{app_name}' has permission for: {', '.join(granted)}."

    @tool(ToolKind.WRITE)
    def grant_app_permission(self, app_name: str, permission: str) -> str:
        """Gives a specific permission to an app (like access to storage, camera, or location). Required for some app functions to work properly.

        Args:
            app_name: The name of the app to grant the permission to.
            permission: The permission to grant, should be lowercase.
        """  # noqa: E501
        app = self.device.app_statuses.get(app_name)
        permission = permission.lower()
        if not app:
            ok, text = False, f"App '{app_name}' not found. Cannot grant permission."
        else:
            available = list(app.permissions.model_dump().keys())
            if permission not in available:
                ok, text = (
                    False,
                    f"Permission '{permission}' not tracked for app '{app_name}', "
                    f"available permissions: {available}",
                )
            else:
                setattr(app.permissions, permission, True)
                ok, text = True, f"Permission '{permission}' granted to app '{app_name}'."
        return self._with_bar(("Success. " if ok else "Error. ") + text)

    def remove_app_permission(self, app_name: str, permission: str) -> tuple[bool, str]:
        """Take a permission away from an app (a task's initialization)."""
        app = self.device.app_statuses.get(app_name)
        permission = permission.lower()
        if not app:
            return False, f"App '{app_name}' not found. Cannot remove permission."
        if not hasattr(app.permissions, permission):
            return False, f"Permission '{permission}' not tracked for app '{app_name}'."
        setattr(app.permissions, permission, False)
        return True, f"Permission '{permission}' removed from app '{app_name}'."

    # -- MMS --------------------------------------------------------------------------------------

    @tool(ToolKind.READ)
    def can_send_mms(self) -> str:
        """Checks if the default messaging app can send MMS messages."""
        if self._can_send_mms():
            return "Your messaging app can send MMS messages."
        return "Your messaging app cannot send MMS messages."

    def _can_send_mms(self) -> bool:
        device = self.device
        if not self._get_mobile_data_working():
            return False
        if device.network_technology_connected == NetworkTechnology.TWO_G:
            return False
        if device.wifi_calling_enabled and device.wifi_calling_mms_over_wifi:
            return False
        if device.active_apn_settings.mmsc_url is None:
            return False
        messaging = device.app_statuses.get("messaging")
        if messaging is None:
            return False
        return messaging.permissions.storage and messaging.permissions.sms

    # -- device -----------------------------------------------------------------------------------

    @tool(ToolKind.WRITE)
    def reboot_device(self) -> str:
        """Restarts your phone completely. This can help resolve many temporary software glitches by refreshing all running services and connections."""  # noqa: E501
        lines = []
        if self.device.active_apn_settings.reset_at_reboot:
            lines.append("Resetting APN settings...")
            self.device.active_apn_settings = APNSettings()
        lines.append("Restarting network services...")
        self.device.network_connection_status = NetworkStatus.SEARCHING
        self.simulate_network_search()
        return self._with_bar("\n".join(lines))

    def simulate_network_search(self) -> None:
        """Decide the cellular connection from the SIM, the preferred mode and the blockers."""
        device, signals = self.device, self.surroundings.signal_strength
        if self._check_sim_status() == SimStatus.ACTIVE:
            device.network_connection_status = NetworkStatus.CONNECTED
            pref = device.network_mode_preference  # compared, never hashed: it may be anything
            tech = NetworkTechnology.FOUR_G
            if pref == NetworkModePreference.FOUR_G_5G_PREFERRED:
                if (
                    signals.get(NetworkTechnology.FIVE_G, SignalStrength.NONE)
                    != SignalStrength.NONE
                ):
                    tech = NetworkTechnology.FIVE_G
            elif pref == NetworkModePreference.THREE_G_ONLY:
                tech = NetworkTechnology.THREE_G
            elif pref == NetworkModePreference.TWO_G_ONLY:
                tech = NetworkTechnology.TWO_G
            device.network_technology_connected = tech
            device.network_signal_strength = signals.get(tech, SignalStrength.NONE)
        else:
            self._no_service()
        # each blocker is looked at, in tau2's order (a broken APN object fails here as there)
        if device.airplane_mode:
            self._no_service()
        if device.active_apn_settings.apn_name == APNNames.BROKEN:
            self._no_service()
        if not self.surroundings.line_active:
            self._no_service()

    def _no_service(self) -> None:
        self.device.network_connection_status = NetworkStatus.NO_SERVICE
        self.device.network_technology_connected = NetworkTechnology.NONE
        self.device.network_signal_strength = SignalStrength.NONE

    # -- payments ---------------------------------------------------------------------------------

    @tool(ToolKind.READ)
    def check_payment_request(self) -> str:
        """
        Checks if the agent has sent you a payment request.
        """
        request = self.surroundings.payment_request
        if request is None:
            return "No payment request has been made."
        return f"You have a payment request for bill {request.bill_id} of {request.amount_due} USD."

    @tool(ToolKind.WRITE)
    def make_payment(self) -> str:
        """
        Makes a payment for the bill that the agent has sent you.
        """
        request = self.surroundings.payment_request
        if request is None:
            return "You do not have a payment request."
        request.paid = True
        return f"Payment of {request.amount_due} USD has been made for bill {request.bill_id}."

    # -- tasks' assertions ------------------------------------------------------------------------

    def assert_airplane_mode_status(self, expected_status: bool) -> bool:
        """Whether airplane mode is ``expected_status``."""
        return self.device.airplane_mode == expected_status

    def assert_service_status(self, expected_status: str) -> bool:
        """Whether the connection status is ``expected_status``."""
        return self.device.network_connection_status == NetworkStatus(expected_status)

    def assert_mobile_data_status(self, expected_status: bool) -> bool:
        """Whether mobile data works (``expected_status``)."""
        return self._get_mobile_data_working() == expected_status

    def assert_mobile_roaming_status(self, expected_status: bool) -> bool:
        """Whether data roaming is ``expected_status``."""
        return self.device.roaming_enabled == expected_status

    def assert_mobile_data_saver_mode_status(self, expected_status: bool) -> bool:
        """Whether Data Saver is ``expected_status``."""
        return self.device.data_saver_mode == expected_status

    def assert_internet_speed(
        self, expected_speed: float, expected_desc: str | None = None
    ) -> bool:
        """Whether the speed test gives at least ``expected_speed`` (and ``expected_desc``)."""
        speed, description = self._run_speed_test()
        speed = speed or 0.0
        if expected_desc is None:
            return speed >= expected_speed
        assert description is not None
        return speed >= expected_speed and description.lower() == expected_desc.lower()

    def assert_internet_not_excellent(self) -> bool:
        """Whether the speed test gives less than excellent."""
        description = self._run_speed_test()[1]
        assert description is not None
        return description.lower() != "excellent"

    def assert_can_send_mms(self, expected_status: bool) -> bool:
        """Whether MMS can be sent (``expected_status``)."""
        return self._can_send_mms() == expected_status

    def assert_mobile_data_usage_exceeded(self, expected_status: bool) -> bool:
        """Whether the data limit is exceeded (``expected_status``)."""
        return self.surroundings.mobile_data_usage_exceeded == expected_status


__all__ += ["AppStatus", "PaymentRequest"]  # re-exported for the environment
