"""Build outgoing HTTP requests for the billing API client."""
from urllib.parse import urlencode


class Request:
    def __init__(self, method, url, headers={}, params=None):
        self.method = method.upper()
        self.url = url
        self.headers = headers
        self.params = params or {}

    def with_header(self, name, value):
        self.headers[name] = value
        return self

    def bearer(self, token):
        return self.with_header("Authorization", "Bearer " + token)

    def with_param(self, name, value):
        self.params[name] = value
        return self

    def full_url(self):
        if not self.params:
            return self.url
        separator = "&" if "?" in self.url else "?"
        return self.url + separator + urlencode(sorted(self.params.items()))
