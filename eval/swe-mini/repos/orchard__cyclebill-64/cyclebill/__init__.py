from .cycles import add_months, billing_dates, next_billing_date

__all__ = ["add_months", "billing_dates", "next_billing_date"]
