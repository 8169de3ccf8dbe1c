"""The retail database: products by id, users by id, orders by id.

Field names, order and types are tau2's (they decide the tools' JSON output, the database hash
and the validation errors tools report); models are not re-validated on assignment, as in tau2.
"""

from typing import Literal

from pydantic import BaseModel

from builtin_envs.tau2.db import TableDB

__all__ = [
    "GiftCard",
    "Order",
    "OrderPayment",
    "PaymentMethod",
    "Product",
    "RetailDB",
    "User",
    "UserAddress",
    "Variant",
]


class Variant(BaseModel):
    item_id: str
    options: dict[str, str]
    available: bool
    price: float


class Product(BaseModel):
    name: str
    product_id: str
    variants: dict[str, Variant]


class UserName(BaseModel):
    first_name: str
    last_name: str


class UserAddress(BaseModel):
    address1: str
    address2: str
    city: str
    country: str
    state: str
    zip: str


class PaymentMethodBase(BaseModel):
    source: str
    id: str


class CreditCard(PaymentMethodBase):
    source: Literal["credit_card"]
    brand: str
    last_four: str


class Paypal(PaymentMethodBase):
    source: Literal["paypal"]


class GiftCard(PaymentMethodBase):
    source: Literal["gift_card"]
    balance: float
    id: str


PaymentMethod = CreditCard | GiftCard | Paypal


class User(BaseModel):
    user_id: str
    name: UserName
    address: UserAddress
    email: str
    payment_methods: dict[str, PaymentMethod]
    orders: list[str]


class OrderFullfilment(BaseModel):
    tracking_id: list[str]
    item_ids: list[str]


class OrderItem(BaseModel):
    name: str
    product_id: str
    item_id: str
    price: float
    options: dict[str, str]


class OrderPayment(BaseModel):
    transaction_type: Literal["payment", "refund"]
    amount: float
    payment_method_id: str


OrderStatus = Literal[
    "processed",
    "pending",
    "pending (item modified)",
    "delivered",
    "cancelled",
    "exchange requested",
    "return requested",
]


class Order(BaseModel):
    order_id: str
    user_id: str
    address: UserAddress
    items: list[OrderItem]
    status: OrderStatus
    fulfillments: list[OrderFullfilment]
    payment_history: list[OrderPayment]
    cancel_reason: Literal["no longer needed", "ordered by mistake"] | None = None
    exchange_items: list[str] | None = None
    exchange_new_items: list[str] | None = None
    exchange_payment_method_id: str | None = None
    exchange_price_difference: float | None = None
    return_items: list[str] | None = None
    return_payment_method_id: str | None = None


class RetailDB(TableDB):
    """Database containing all retail-related data including products, users and orders"""

    products: dict[str, Product]
    users: dict[str, User]
    orders: dict[str, Order]
