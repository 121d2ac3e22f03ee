from reqbuild import Request


def test_method_is_uppercased():
    assert Request("get", "https://api.example.com/v1/invoices").method == "GET"


def test_bearer_sets_authorization():
    request = Request("GET", "https://api.example.com/v1/invoices").bearer("tok")
    assert request.headers["Authorization"] == "Bearer tok"


def test_full_url_encodes_sorted_params():
    request = Request("GET", "https://api.example.com/v1/invoices?x=1")
    request.with_param("status", "open").with_param("customer", "a b")
    assert request.full_url() == "https://api.example.com/v1/invoices?x=1&customer=a+b&status=open"
