// Smoke program for the Go client generated from docs/openapi.json (docs/clients.md).
//
// Uses only the generated package: no casts of response values, no hand-parsed JSON.
// Env: ISTHMUS_URL, ISTHMUS_TOKEN (a user of team-a), ISTHMUS_ADMIN_TOKEN, ISTHMUS_SMOKE_ID
// (makes names unique). Exits non-zero on the first surprise.
package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	isthmus "isthmus.invalid/smoke/isthmus"
)

func check(ok bool, format string, args ...any) {
	if !ok {
		fmt.Fprintf(os.Stderr, "FAIL: "+format+"\n", args...)
		os.Exit(1)
	}
}

func must[T any](v T, resp *http.Response, err error) T {
	if err != nil {
		body := ""
		var apiErr *isthmus.GenericOpenAPIError
		if errors.As(err, &apiErr) {
			body = string(apiErr.Body())
		}
		check(false, "unexpected error: %v %s", err, body)
	}
	return v
}

func mustDo(resp *http.Response, err error) {
	must(resp, resp, err)
	check(resp.StatusCode == 204, "status %d", resp.StatusCode)
}

// problem returns the typed RFC 9457 error the client decoded for an error response.
func problem(err error, resp *http.Response, status int) isthmus.Problem {
	check(err != nil, "expected HTTP %d, got success", status)
	check(resp != nil && resp.StatusCode == status, "expected HTTP %d, got %v", status, resp)
	check(strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json"),
		"error content type %q", resp.Header.Get("Content-Type"))
	var apiErr *isthmus.GenericOpenAPIError
	check(errors.As(err, &apiErr), "error is not a GenericOpenAPIError: %T", err)
	p, ok := apiErr.Model().(isthmus.Problem)
	check(ok, "error model is %T, not Problem (%s)", apiErr.Model(), apiErr.Body())
	check(p.Status == int64(status), "problem status %d", p.Status)
	return p
}

func main() {
	id := os.Getenv("ISTHMUS_SMOKE_ID")
	cfg := isthmus.NewConfiguration()
	cfg.Servers = isthmus.ServerConfigurations{{URL: os.Getenv("ISTHMUS_URL")}}
	c := isthmus.NewAPIClient(cfg)
	user := context.WithValue(context.Background(), isthmus.ContextAccessToken, os.Getenv("ISTHMUS_TOKEN"))
	admin := context.WithValue(context.Background(), isthmus.ContextAccessToken, os.Getenv("ISTHMUS_ADMIN_TOKEN"))

	ready := must(c.HealthAPI.Readyz(context.Background()).Execute())
	check(ready.Status == isthmus.READYSTATUS_OK, "readyz status %q", ready.Status)

	// --- jobs: submit with an Idempotency-Key, replay it
	spec := isthmus.NewJobSpec("team-a", []string{"python", "train.py"}, "go-smoke-"+id)
	spec.SetWorkers(2)
	spec.SetGpusPerWorker(4)
	mem := int64(8192) // integer MiB is accepted, as the spec says
	spec.SetMemoryPerWorker(isthmus.MemoryPerWorker{Int64: &mem})
	limit := "90m"
	spec.SetTimeLimit(isthmus.TimeLimit{String: &limit})
	key := "go-smoke-key-" + id
	job, resp, err := c.JobsAPI.SubmitJob(user).JobSpec(*spec).IdempotencyKey(key).Execute()
	must(job, resp, err)
	check(resp.StatusCode == 202, "submit status %d", resp.StatusCode)
	check(job.State == isthmus.JOBSTATE_PENDING && job.TotalGpus == 8, "submitted job %+v", job)
	check(job.MemoryPerWorker == "8Gi" && job.TimeLimit == "01:30:00", "normalised %s %s", job.MemoryPerWorker, job.TimeLimit)
	check(!job.AssignedBackend.IsSet() || job.AssignedBackend.Get() == nil, "pending job already routed")
	again, resp, err := c.JobsAPI.SubmitJob(user).JobSpec(*spec).IdempotencyKey(key).Execute()
	must(again, resp, err)
	check(resp.StatusCode == 200 && again.Id == job.Id, "replay: status %d id %s", resp.StatusCode, again.Id)

	// --- list (filter with values read back from a response), get, events, cancel
	page := must(c.JobsAPI.ListJobs(user).State([]isthmus.JobState{job.State}).Backend(job.Backend).Limit(50).Execute())
	found := false
	for _, j := range page.Items {
		found = found || j.Id == job.Id
	}
	check(found, "submitted job not listed")
	got := must(c.JobsAPI.GetJob(user, job.Id).Execute())
	check(got.Name == spec.Name && got.CreatedAt.Equal(job.CreatedAt), "get: %+v", got)
	cancelled := must(c.JobsAPI.CancelJob(user, job.Id).Execute())
	check(cancelled.State == isthmus.JOBSTATE_CANCELLED, "cancel: state %s", cancelled.State)
	check(cancelled.EndedAt.Get() != nil && cancelled.ExitCode.Get() == nil, "cancelled pending job: ended_at %v, exit_code %v", cancelled.EndedAt.Get(), cancelled.ExitCode.Get())
	events := must(c.JobsAPI.ListJobEvents(user, job.Id).After(0).Execute())
	var states []string
	for _, e := range events.Items {
		if to, ok := e.GetToStateOk(); ok && to != nil {
			states = append(states, string(*to))
		}
	}
	check(strings.Join(states, ",") == "pending,cancelled", "events: %v", states)
	more := must(c.JobsAPI.ListJobEvents(user, job.Id).After(events.Items[len(events.Items)-1].Id).Execute())
	check(len(more.Items) == 0, "events after the last: %d", len(more.Items))

	// --- a validation error, read as Problem (job spec and a path parameter)
	bad := *spec
	bad.SetWorkers(0)
	_, resp, err = c.JobsAPI.SubmitJob(user).JobSpec(bad).Execute()
	p := problem(err, resp, 422)
	check(len(p.Errors) > 0 && p.Errors[0].Field == "body.workers", "problem errors %+v", p.Errors)
	check(p.Title == "Invalid request" && strings.Contains(p.Detail, "body.workers"), "problem %s: %s", p.Title, p.Detail)
	_, resp, err = c.AdminAPI.GetAccount(admin, "Not_An_Account").Execute()
	p = problem(err, resp, 422)
	check(p.Errors[0].Field == "path.name", "getAccount 422 field %q", p.Errors[0].Field)
	_, resp, err = c.AccountsAPI.GetAccountUsage(user, "team-b").Execute()
	p = problem(err, resp, 404)
	check(p.Detail != "", "404 without detail")

	// --- admin: an account with a budget that needs full double precision
	name := "go-smoke-" + id
	quota := isthmus.NewQuotaIn()
	quota.SetBudgetGpuHours(1234567.89)
	quota.SetBudgetPeriod(isthmus.BUDGETPERIOD_MONTH)
	create := isthmus.NewAccountCreate(name)
	create.SetQuota(*quota)
	acc := must(c.AdminAPI.CreateAccount(admin).AccountCreate(*create).Execute())
	check(*acc.Quota.BudgetGpuHours.Value.Get() == 1234567.89, "budget %v", *acc.Quota.BudgetGpuHours.Value.Get())
	// the period read back goes straight into the next request
	quota2 := isthmus.NewQuotaIn()
	quota2.SetMaxGpus(5_000_000_000 / 10_000)
	quota2.SetBudgetPeriod(*acc.Quota.BudgetPeriod.Get())
	acc = must(c.AdminAPI.SetAccountQuota(admin, name).QuotaIn(*quota2).Execute())
	check(*acc.Quota.MaxGpus.Value.Get() == 500_000, "max_gpus %v", acc.Quota.MaxGpus.Value.Get())
	all := must(c.AdminAPI.ListAllAccounts(admin).Execute())
	check(len(all) >= 3, "listAllAccounts: %d", len(all))

	// members: a role read back is passed back
	role := isthmus.MEMBERROLE_COORDINATOR
	member := must(c.AdminAPI.SetAccountMember(admin, name, "alice").MemberIn(isthmus.MemberIn{Role: &role}).Execute())
	must(c.AdminAPI.SetAccountMember(admin, name, "bob").MemberIn(isthmus.MemberIn{Role: &member.Role}).Execute())
	members := must(c.AdminAPI.ListAccountMembers(admin, name).Execute())
	check(len(members) == 2 && members[1].Role == isthmus.MEMBERROLE_COORDINATOR, "members %+v", members)
	mustDo(c.AdminAPI.RemoveAccountMember(admin, name, "bob").Execute())

	// billing weights: a pool read back is passed back
	gpuType := "go-smoke-" + id
	must(c.AdminAPI.SetBillingWeight(admin, "slurm", gpuType).BillingWeightIn(*isthmus.NewBillingWeightIn(2)).Execute())
	var mine *isthmus.BillingWeightOut
	for _, w := range must(c.AdminAPI.ListBillingWeights(admin).Execute()) {
		if w.GpuType == gpuType {
			mine = &w
		}
	}
	check(mine != nil && mine.Pool == "slurm", "billing weight not listed")
	w := must(c.AdminAPI.SetBillingWeight(admin, mine.Pool, mine.GpuType).BillingWeightIn(*isthmus.NewBillingWeightIn(1.5)).Execute())
	check(w.Pool == mine.Pool && w.Weight == 1.5, "weight %+v", w)

	// --- a large credit: 1,000,000 GPU-hours is -3.6e9 GPU-seconds (beyond int32)
	credit := isthmus.NewAdjustmentIn(name, 1_000_000, "credit", "go smoke "+id)
	entry := must(c.AdminAPI.CreateLedgerAdjustment(admin).AdjustmentIn(*credit).Execute())
	check(entry.GpuSeconds == -3_600_000_000 && entry.Kind == isthmus.LEDGERENTRYKIND_CREDIT, "credit %+v", entry)
	ledger := must(c.AdminAPI.ListLedgerEntries(admin).Account(name).Kind([]isthmus.LedgerEntryKind{entry.Kind}).Execute())
	check(len(ledger.Items) == 1 && ledger.Items[0].Id == entry.Id && ledger.Items[0].GpuSeconds == -3_600_000_000,
		"ledger %+v", ledger.Items)
	must(c.AdminAPI.ListLedgerEntries(admin).Limit(1000).Execute()) // every entry still decodes

	// --- usage as JSON and CSV
	report := must(c.AdminAPI.GetUsageReport(admin).Account(name).Execute())
	check(len(report.Items) == 1 && report.Items[0].AdjustmentGpuSeconds == -3_600_000_000 &&
		report.Items[0].NetGpuHours == -1_000_000, "usage %+v", report.Items)
	csv := must(c.AdminAPI.GetUsageReportCsv(admin).Account(name).Period(report.Period).Execute())
	check(strings.HasPrefix(csv, "account,pool,period,") && strings.Contains(csv, name+",,") &&
		strings.Contains(csv, ",-3600000000,"), "csv %q", csv)
	usage := must(c.AccountsAPI.GetAccountUsage(admin, name).Execute())
	check(usage.Account == name, "usage account %s", usage.Account)

	// --- delete, then the account is gone (a Problem again)
	mustDo(c.AdminAPI.DeleteAccount(admin, name).Execute())
	_, resp, err = c.AdminAPI.GetAccount(admin, name).Execute()
	problem(err, resp, 404)
	fmt.Println("go smoke: ok")
}
