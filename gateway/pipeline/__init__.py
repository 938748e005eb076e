"""The request's pipeline below the routes: the steps every completion route shares
(``steps.Pipeline``)."""
