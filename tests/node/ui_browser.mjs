// The Environment Center in a real browser (Debian's chromium driven by playwright-core), for
// tests/test_ui_browser.py: one browser, every page, by mouse and by keyboard. What it saw is
// printed as one JSON object on stdout; the test asserts on it. Screenshots go to SHOTS.
//
// Environment: UI_URL (aenv ui's printed URL, with its token), RUN_A, RUN_B (two runs' names),
// LONG_TASK (a task whose tool output is long), HUB_URL, HUB_KEY (a key of the tenant that owns
// OWN_INSTANCE), OTHER_INSTANCE (another tenant's), ENV_NAME (an environment published on the
// hub), SHOTS (a directory).
import { chromium } from "playwright-core";

const env = process.env;
const out = { console: [], steps: {} };
const browser = await chromium.launch({
  executablePath: env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
});
const context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
const page = await context.newPage();
page.setDefaultTimeout(20000);
page.on("console", (m) => { if (m.type() === "error" || m.type() === "warning") out.console.push(`${m.type()}: ${m.text()}`); });
page.on("pageerror", (e) => out.console.push(`pageerror: ${e.message}`));
const shot = (name) => page.screenshot({ path: `${env.SHOTS}/${name}.png` });
const heading = async () => (await page.locator("h1").textContent()).trim();
const focused = () => page.evaluate(() => { const a = document.activeElement; return a ? `${a.tagName.toLowerCase()}:${(a.textContent || a.getAttribute("name") || "").trim().slice(0, 40)}` : null; });
const settled = () => page.waitForFunction(() => !document.querySelector("main .chart") || [...document.querySelectorAll("main .chart")].every((c) => c.querySelector(".main-svg")));

try {
  // -- runs, by keyboard: Tab from the top reaches run A's link, Enter opens it ----------------
  await page.goto(env.UI_URL);
  await page.waitForSelector("main table");
  out.steps.runs = { url: page.url(), heading: await heading(), rows: await page.locator("main table tbody tr").count() };
  await shot("runs");
  // the page's focus is on its heading: Shift+Tab goes back up (the pages, the skip link),
  // Tab goes on into the content
  const back = [];
  for (let i = 0; i < 4; i++) {
    await page.keyboard.press("Shift+Tab");
    back.push(await focused());
  }
  out.steps.tab_back = back;
  await page.locator("h1").focus();
  const order = [];
  for (let i = 0; i < 12; i++) {
    await page.keyboard.press("Tab");
    const f = await focused();
    order.push(f);
    if (f === `a:${env.RUN_A}`) break;
  }
  out.steps.tab_order = order;
  await page.keyboard.press("Enter");
  await page.waitForFunction((name) => document.querySelector("h1")?.textContent === `Run ${name}`, env.RUN_A);
  out.steps.run = { heading: await heading(), focused: await focused(), cards: await page.locator(".card").allTextContents() };
  await shot("run");

  // -- rewards: the charts are drawn (plotly, from the package) ---------------------------------
  await page.getByRole("link", { name: "Rewards" }).click();
  await page.waitForFunction((name) => document.querySelector("h1")?.textContent === `Rewards of ${name}`, env.RUN_A);
  await page.waitForSelector("main .chart .main-svg");
  await settled();
  out.steps.rewards = { heading: await heading(), charts: await page.locator("main .chart .main-svg").count(), tools: await page.locator("main table").first().locator("tbody tr").allTextContents() };
  await shot("rewards");

  // -- episodes: filter by task, then open one, then a tool call --------------------------------
  await page.getByRole("link", { name: "Episodes", exact: true }).click();
  await page.waitForFunction((name) => document.querySelector("h1")?.textContent === `Episodes of ${name}`, env.RUN_A);
  out.steps.episodes_all = await page.locator("main table tbody tr").count();
  await page.selectOption("select[name=task]", env.LONG_TASK);
  await page.getByRole("button", { name: "Filter" }).click();
  await page.waitForFunction((t) => location.hash.includes("task=" + t), env.LONG_TASK);
  // the filtered page has replaced the whole one (the hash changes before the rows come)
  await page.waitForFunction((n) => document.querySelectorAll("main table tbody tr").length !== n, out.steps.episodes_all);
  const tasks = await page.locator("main table tbody tr td:nth-child(2)").allTextContents();
  out.steps.episodes_filtered = { hash: await page.evaluate(() => location.hash), tasks };
  await shot("episodes");
  await page.locator("main table tbody tr td a").first().click();
  await page.waitForSelector("section.msg");
  const calls = page.locator("details.call");
  await calls.first().locator(":scope > summary").click();
  out.steps.episode = {
    heading: await heading(),
    roles: await page.locator("section.msg .who").allTextContents(),
    call_open: await calls.first().evaluate((d) => d.open),
    call_summary: (await calls.first().locator(":scope > summary").textContent()).trim(),
    call_text: await calls.first().innerText(),
    folded: await page.locator("details summary.folded").allTextContents(),
    hash: await page.evaluate(() => location.hash),
  };
  // the second call opened by keyboard: focus its summary, Enter
  await calls.nth(1).locator(":scope > summary").focus();
  await page.keyboard.press("Enter");
  out.steps.episode.second_open_by_keyboard = await calls.nth(1).evaluate((d) => d.open);
  await page.evaluate(() => window.scrollTo(0, 0));
  await shot("episode");
  // a folded output: the whole text is in the page, one click away
  const fold = page.locator("details:has(> summary.folded)").first();
  if (await fold.count()) {
    await fold.locator(":scope > summary").click();
    out.steps.episode.unfolded_chars = (await fold.locator("pre").innerText()).length;
  }
  // the permalink opens the same episode again (a new page load)
  const link = page.url();
  await page.goto("about:blank");
  await page.goto(link);
  await page.waitForSelector("section.msg");
  out.steps.permalink = { heading: await heading() };

  // -- two runs side by side --------------------------------------------------------------------
  await page.getByRole("link", { name: "Compare" }).click();
  await page.waitForSelector("form.filters");
  await page.selectOption("select[name=a]", env.RUN_A);
  await page.selectOption("select[name=b]", env.RUN_B);
  await page.getByRole("button", { name: "Compare" }).click();
  await page.waitForSelector("main table");
  await settled();
  const rows = await page.locator("main table tbody tr").evaluateAll((trs) => trs.map((tr) => [...tr.children].slice(0, 2).map((td) => td.textContent)));
  out.steps.compare = { heading: await heading(), rows };
  await shot("compare");

  // -- the hub's page: the key by keyboard, environments, instances -----------------------------
  await page.goto(env.HUB_URL + "/ui/");
  await page.waitForSelector("input[name=key]");
  out.steps.hub_login = { heading: await heading() };
  await page.locator("input[name=key]").focus();
  await page.keyboard.type(env.HUB_KEY);
  await page.keyboard.press("Enter");
  await page.waitForFunction(() => document.querySelector("h1")?.textContent === "Environments");
  await page.locator("input[name=q]").fill(env.ENV_NAME);
  await page.getByRole("button", { name: "Search" }).click();
  await page.waitForFunction((n) => location.hash.includes(n), env.ENV_NAME);
  await page.getByRole("link", { name: env.ENV_NAME, exact: true }).waitFor();
  out.steps.hub_envs = await page.locator("main table tbody tr td:first-child").allTextContents();
  await shot("hub-environments");
  await page.getByRole("link", { name: env.ENV_NAME, exact: true }).click();
  await page.waitForSelector("form.schema-form");
  await page.waitForFunction(() => !document.body.innerText.includes("reading README from the bundle"));
  out.steps.hub_env = {
    heading: await heading(),
    forms: await page.locator("form.schema-form legend").allTextContents(),
    tools: await page.locator("div.tools form.schema-form legend").allTextContents(),
    tool_fields: await page.locator("div.tools form.schema-form label").allTextContents(),
    fields: await page.locator("form.schema-form label").allTextContents(),
    readme: (await page.locator("main").innerText()).includes("README"),
    readme_text: await page.locator("h2:has-text('README') + div").innerText(),
  };
  await shot("hub-environment");
  await page.getByRole("link", { name: "Instances" }).click();
  await page.waitForSelector("main table");
  const ids = () => page.locator("main table").first().locator("tbody tr td:first-child").allTextContents();
  out.steps.hub_instances = { before: await ids() };
  await shot("hub-instances");
  const row = page.locator("main table").first().locator("tbody tr", { hasText: env.OWN_INSTANCE });
  await row.getByRole("button", { name: "Renew 30m" }).click();
  await page.waitForFunction(() => document.getElementById("status").textContent.includes("Renew 30m: done"));
  await page.locator("main table").first().locator("tbody tr", { hasText: env.OWN_INSTANCE }).getByRole("button", { name: "Delete" }).click();
  await page.waitForFunction((id) => ![...document.querySelectorAll("main table tbody tr td:first-child")].some((td) => td.textContent === id), env.OWN_INSTANCE);
  out.steps.hub_instances.after = await ids();
} catch (err) {
  out.error = String(err && err.stack || err);
  await shot("failure").catch(() => {});
} finally {
  await browser.close();
}
process.stdout.write(JSON.stringify(out) + "\n");
