package retention

// ForgetInFlight bounds the runs whose Forgetters run at once, for tests.
const ForgetInFlight = forgetInFlight
